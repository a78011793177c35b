#!/usr/bin/env bash
# Loom's training step on this CPU against PyTorch 2.15 (PyPI: MKL, oneDNN) on the same
# model: single device at 1 and 2 threads, torch.compile at 1 thread, and DDP over 2 ranks
# of one thread each (gloo for PyTorch). docs/performance.md, "Training step against
# PyTorch". Interleaved: each round runs every pair, Loom then its peer; a run's figure is
# the median step from step 5 on (the slowest rank's for DDP). Both start from the same
# weights (the peer writes them, Loom loads them with --init) and read the same tokens: an
# llm.c shard of seeded random tokens written here (Loom's --data, the peers' --tokens),
# in train_gpt's data order (data/token_blocks.h) on both sides. AdamW
# (lr 1e-3, betas 0.9/0.95, weight decay 0.1), no gradient clipping, on both sides; the peers
# decay every parameter and train_gpt those of two or more dimensions, so the losses agree at
# the first step and drift apart by that decay after it (scripts/gpu_loss_parity.py matches
# both). Not for
# CI: it needs the peers' venv (bench/peers/python/setup.sh, 5.7 GB).
#
#   bash bench/cpu_step/vs_torch.sh [OUTDIR]
# MODEL_ARGS with --model llama (and --kv-heads, --intermediate, --tie-embeddings) compares
# Loom's Llama with Hugging Face transformers' LlamaForCausalLM (bench/peers/python/llama.py;
# bench/models/setup.sh installs transformers), both DDP and single.
# Environment: ROUNDS (3), STEPS (25), MODEL_ARGS, PEERS_VENV, LABELS (the pairs to run, by
# label; default the four below without bf16: single_1thread_bf16 is bf16-mixed on both sides).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PEERS=$ROOT/bench/peers/python
OUT=${1:-$ROOT/build/bench-cpu-step}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-25}
V=${PEERS_VENV:-/tmp/peers-venv}
T=$ROOT/build/release/tools/train_gpt/train_gpt
read -r -a MODEL <<< "${MODEL_ARGS:---layers 4 --heads 4 --embd 128 --ctx 128 --batch 8}"

[ -x "$V/bin/torchrun" ] || { echo "no peers venv at $V: run bash $PEERS/setup.sh" >&2; exit 1; }
[ -x "$T" ] || { echo "build Loom first (cmake --build --preset release)" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd) # absolute: the peers run from $PEERS
export OMP_NUM_THREADS=1
INIT=$OUT/init.safetensors
if [[ " ${MODEL[*]} " == *" --model llama "* ]]; then
  # Hugging Face's LlamaForCausalLM writes a model directory; Loom's --init reads it as it is.
  INIT=$OUT/init_hf
  "$V/bin/python" "$PEERS/single.py" "${MODEL[@]}" --steps 1 --save-init "$INIT" > /dev/null
else
  "$V/bin/python" "$PEERS/single.py" "${MODEL[@]}" --steps 1 \
    --save-init "$OUT/init_torch.safetensors" > /dev/null
  # PyTorch's Linear weights are [out, in]; GPT-2's Conv1D layout, which --init reads, [in, out].
  "$V/bin/python" - "$OUT/init_torch.safetensors" "$INIT" <<'PY'
import sys
from safetensors.torch import load_file, save_file
state = load_file(sys.argv[1])
linear = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
save_file({k: (v.t().contiguous() if k.endswith(linear) else v) for k, v in state.items()}, sys.argv[2])
PY
fi

# Enough tokens for every step of two data-parallel ranks, below the model's vocabulary.
"$V/bin/python" - "$OUT/tokens.bin" "$STEPS" "${MODEL[@]}" <<'PY'
import argparse, sys
import numpy as np
p = argparse.ArgumentParser()
for flag, default in (("--batch", 8), ("--ctx", 128), ("--vocab", 256)):
    p.add_argument(flag, type=int, default=default)
a, _ = p.parse_known_args(sys.argv[3:])
count = int(sys.argv[2]) * 2 * a.batch * a.ctx + 1
header = np.zeros(256, dtype=np.int32)
header[:3] = (20240520, 1, count)
tokens = np.random.default_rng(47).integers(0, a.vocab, size=count).astype(np.uint16)
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    f.write(tokens.tobytes())
PY

LOOM=("$T" "${MODEL[@]}" --init "$INIT" --data "$OUT/tokens.bin" --grad-clip 0
      --lr 1e-3 --beta2 0.95 --steps "$STEPS"
      --warmup-steps 0 --schedule constant --log-interval 1000)
# label | Loom's flags | the peer's command (run in bench/peers/python)
PAIRS=(
  "single_1thread|--threads 1|$V/bin/python single.py --threads 1"
  "single_2threads|--threads 2|$V/bin/python single.py --threads 2"
  "single_compile|--threads 1|$V/bin/python single.py --threads 1 --compile"
  "ddp_2x1|--strategy ddp_spawn --devices 2 --threads 1|$V/bin/torchrun --nproc-per-node 2 --master-port PORT ddp.py"
  "single_1thread_bf16|--threads 1 --precision bf16-mixed|$V/bin/python single.py --threads 1 --precision bf16-mixed"
)
read -r -a WANTED <<< "${LABELS:-single_1thread single_2threads single_compile ddp_2x1}"
wanted() { local w; for w in "${WANTED[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }
port=29850
for round in $(seq 1 "$ROUNDS"); do
  for pair in "${PAIRS[@]}"; do
    IFS='|' read -r label loom peer <<< "$pair"
    wanted "$label" || continue
    # shellcheck disable=SC2086
    "${LOOM[@]}" $loom --metrics "$OUT/loom_${label}_r$round.jsonl" \
      > "$OUT/loom_${label}_r$round.log" 2>&1 || echo "loom $label failed (see $OUT/loom_${label}_r$round.log)"
    port=$((port + 1))
    # shellcheck disable=SC2086
    (cd "$PEERS" && timeout 900 ${peer/PORT/$port} "${MODEL[@]}" --steps "$STEPS" \
      --tokens "$OUT/tokens.bin" \
      --out "$OUT/peer_${label}_r$round" > "$OUT/peer_${label}_r$round.log" 2>&1) ||
      echo "peer $label failed (see $OUT/peer_${label}_r$round.log)"
    echo "round $round: $label done"
  done
done
{ date -Iseconds; lscpu | grep 'Model name'; git -C "$ROOT" rev-parse --short HEAD; } > "$OUT/machine.txt"

python3 "$ROOT/bench/train_gpt_pairs_summary.py" "$OUT" "$ROUNDS" "${WANTED[@]}"
