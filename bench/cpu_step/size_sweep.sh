#!/usr/bin/env bash
# Loom's training step against PyTorch 2.15 at the sizes people train (issue 47): GPT shapes of
# 0.8M, 10.7M, 25M and 124M parameters and Llama shapes of 9.6M and 135M (SmolLM-135M's), each
# through bench/cpu_step/vs_torch.sh (interleaved pairs, same weights, the median step from
# step 5 on), then one table with Loom / PyTorch per shape and run, and each step's FLOP/s
# (nanoGPT's count: 6 per parameter and token plus 12 * layers * embd * ctx) as a share of
# this core's FMA peak as loom_bench measures it (times the threads the run used). The host's ISA heads the table. Not for CI: it needs the peers'
# venv (bench/peers/python/setup.sh, 5.7 GB; the Llama shapes also bench/models/setup.sh's
# transformers) and takes about an hour at the defaults.
#
#   bash bench/cpu_step/size_sweep.sh [OUTDIR]
# Environment: SHAPES (0.8M 10M 25M 124M; also llama-10M, smollm-135M), LABELS (vs_torch.sh's
# pairs; default all five, bf16 included), ROUNDS (1), STEPS (10), PEERS_VENV.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/build/bench-size-sweep}
export ROUNDS=${ROUNDS:-1} STEPS=${STEPS:-10}
export LABELS=${LABELS:-single_1thread single_2threads single_compile ddp_2x1 single_1thread_bf16}
read -r -a SIZES <<< "${SHAPES:-0.8M 10M 25M 124M}"
shape_args() {
  case $1 in
    0.8M) echo "--layers 4 --heads 4 --embd 128 --ctx 128 --batch 8" ;;  # the benchmark shape
    10M) echo "--layers 6 --heads 6 --embd 384 --ctx 256 --batch 8" ;;   # nanoGPT shakespeare-char
    25M) echo "--layers 8 --heads 8 --embd 512 --ctx 256 --batch 8" ;;
    124M) echo "--layers 12 --heads 12 --embd 768 --ctx 512 --batch 2 --vocab 50304" ;;  # GPT-2 small
    # Llama against Hugging Face's LlamaForCausalLM: the 10M shape with GQA and SwiGLU, and
    # SmolLM-135M's shape (HuggingFaceTB/SmolLM-135M's config.json) at GPT-2 small's tokens.
    llama-10M) echo "--model llama --layers 6 --heads 6 --kv-heads 2 --embd 384 --intermediate 1024 \
--ctx 256 --batch 8" ;;
    smollm-135M) echo "--model llama --layers 30 --heads 9 --kv-heads 3 --embd 576 --intermediate 1536 \
--tie-embeddings --ctx 512 --batch 2 --vocab 49152" ;;
    *) echo "unknown shape '$1': expected 0.8M, 10M, 25M, 124M, llama-10M or smollm-135M" >&2
       exit 2 ;;
  esac
}
mkdir -p "$OUT"
for size in "${SIZES[@]}"; do shape_args "$size" > /dev/null; done  # refuse a typo up front
fma=$("$ROOT/build/release/bench/loom_bench" --benchmark_filter='BM_CausalAttentionForward/B:8/H:4/T:128/' \
        --benchmark_min_time=0.01 2>&1 | sed -n 's/^Core limits.*FMA \([0-9.]*\) GFLOP\/s (\([a-z0-9]*\)).*/\1 \2/p')
echo "$fma" > "$OUT/fma.txt"
for size in "${SIZES[@]}"; do
  echo "== $size: $(shape_args "$size")"
  MODEL_ARGS=$(shape_args "$size") bash "$ROOT/bench/cpu_step/vs_torch.sh" "$OUT/$size" > "$OUT/$size.log" 2>&1 ||
    { echo "vs_torch.sh failed for $size (see $OUT/$size.log)"; exit 1; }
  echo "$(shape_args "$size")" > "$OUT/$size/model_args.txt"
done
python3 "$ROOT/bench/cpu_step/size_sweep_summary.py" "$OUT" "$ROUNDS" "${SIZES[@]}"
