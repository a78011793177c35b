#!/usr/bin/env bash
# DDP, ZeRO 1-3 and FSDP, and the CPU offloads, over 2 ranks on the emulated CUDA device: each
# rank is a process of train_gpt_emulated (train_gpt linked against the emulated runtime and
# the emulated NCCL) with an emulated GPU of its own, over two process-group backends:
#  - shm: the two share their GPUs as ranks share one GPU, through the shm backend's staging;
#  - nccl: as ranks that each own a GPU, through the emulated NCCL (Note [Emulated NCCL]);
#    FSDP's HYBRID_SHARD too, whose groups are NCCL splits (a build with NCCL's header only).
# Every stage and FSDP must train with DDP's losses and write DDP's weights, bit for bit, on
# either backend (the design's promise, here with CUDA tensors); each offload must run to the
# end with the same losses and weights on both (their update is the CPU's AdamW, which differs
# from the device's by ulps: docs/cuda.md). A 2-stage pipeline (its activations and gradients
# sent between the ranks' GPUs) and tensor parallelism over 2 ranks (with and without sequence
# parallelism; the vocabulary-parallel embedding and loss on the GPU) must give the same bits
# over both backends, and losses within 1e-5 of one device's (their sums run in other orders);
# so must a 3-D job over 4 ranks (pp 2 x tp 2) against DDP's, and a Llama over tp 2, over nccl.
#
#   strategies_on_emulated_cuda.sh LOOMRUN TRAIN_GPT_EMULATED BACKEND...   (shm, nccl)
set -euo pipefail
# Every process checks the order of its streams' work (Note [The stream-order check]): one that
# touches device memory from two streams with nothing ordering them exits with status 86.
export LOOM_STREAM_ORDER_CHECK=1
loomrun=$1
train_gpt=$2
shift 2
backends=("$@")
[ "${backends[0]:-}" = shm ] || { echo "usage: $0 LOOMRUN TRAIN_GPT_EMULATED shm [nccl]"; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The model and run of every job: MODEL's flags (default a GPT-2), BATCH rows per replica
# (default 2).
args() {
  # shellcheck disable=SC2086  # MODEL is a list of flags, split on purpose
  echo --device cuda ${MODEL:---layers 2 --heads 2 --embd 32} --ctx 16 --batch "${BATCH:-2}" \
    --steps 4 --seed 1
}
llama="--model llama --layers 2 --heads 4 --kv-heads 2 --embd 32"

# run NAME BACKEND TRAIN_GPT_FLAGS...: writes $work/NAME.BACKEND.{jsonl,safetensors,log};
# RANKS ranks (default 2).
# shellcheck disable=SC2046
run() {
  local name=$1 backend=$2
  shift 2
  local out=$work/$name.$backend
  if ! "$loomrun" --nproc-per-node "${RANKS:-2}" --master-port 0 "$train_gpt" $(args) "$@" \
      --process-group-backend "$backend" --metrics "$out.jsonl" --save "$out.safetensors" \
      >"$out.log" 2>&1; then
    cat "$out.log"
    echo "strategies_on_emulated_cuda: $name over $backend failed"
    exit 1
  fi
  if [ "$backend" = nccl ] && ! grep -q "backend nccl" "$out.log"; then
    cat "$out.log"
    echo "strategies_on_emulated_cuda: $name did not run over nccl"
    exit 1
  fi
}

# losses FILE [FIELD]: FIELD (default the loss) of every step in FILE.
losses() {
  python3 -c 'import json, sys; print(" ".join(repr(json.loads(l)[sys.argv[2]]) for l in open(sys.argv[1])))' \
    "$1" "${2:-loss}"
}

# single NAME: one device, no launcher: writes $work/NAME.{jsonl,log}.
# shellcheck disable=SC2046
single() {
  "$train_gpt" $(args) --metrics "$work/$1.jsonl" >"$work/$1.log" 2>&1 ||
    { cat "$work/$1.log"; echo "strategies_on_emulated_cuda: $1 failed"; exit 1; }
}

# close RUN REFERENCE: RUN's losses within 1e-5 (relative) of REFERENCE's, step by step.
close() {
  python3 - "$work/$1.jsonl" "$work/$2.jsonl" "$1" "$2" <<'PY'
import json, sys
got, want = ([json.loads(l)["loss"] for l in open(f)] for f in sys.argv[1:3])
bad = [(s, g, w) for s, (g, w) in enumerate(zip(got, want)) if abs(g - w) > 1e-5 * abs(w)]
if len(got) != len(want) or bad:
    sys.exit(f"{sys.argv[3]}: losses {got} not within 1e-5 of {sys.argv[4]}'s {want}")
print(f"{sys.argv[3]}: losses within 1e-5 of {sys.argv[4]}'s")
PY
}

# same RUN REFERENCE: RUN's losses, gradient norms (which set each step's clipping) and saved
# weights are REFERENCE's, bit for bit.
same() {
  local got want field
  for field in loss grad_norm; do
    got=$(losses "$work/$1.jsonl" $field)
    want=$(losses "$work/$2.jsonl" $field)
    [ "$got" = "$want" ] || { echo "$1: $field $got differs from $2's ($want)"; exit 1; }
  done
  cmp -s "$work/$2.safetensors" "$work/$1.safetensors" ||
    { echo "$1: weights differ from $2's"; exit 1; }
  echo "$1: losses and weights equal to $2's"
}

strategies=(ddp deepspeed_stage_1 deepspeed_stage_2 deepspeed_stage_3 fsdp)
offloads=(deepspeed_stage_2_offload fsdp_cpu_offload)
for backend in "${backends[@]}"; do
  for name in "${strategies[@]}" "${offloads[@]}"; do
    run "$name" "$backend" --strategy "$name"
  done
done
echo "ddp.shm: losses $(losses "$work/ddp.shm.jsonl")"
for name in "${strategies[@]:1}"; do
  same "$name.shm" ddp.shm
done
for name in "${offloads[@]}"; do
  echo "$name.shm: losses $(losses "$work/$name.shm.jsonl")"
done
if [[ " ${backends[*]} " == *" nccl "* ]]; then
  run fsdp_hybrid_shard nccl --strategy fsdp --fsdp-sharding-strategy HYBRID_SHARD
  for name in "${strategies[@]}" fsdp_hybrid_shard; do
    same "$name.nccl" ddp.shm
  done
  for name in "${offloads[@]}"; do
    same "$name.nccl" "$name.shm"
  done
fi
# The pipeline and tensor parallelism: each rank takes its own GPU (--devices auto: one per
# process here).
single single
for backend in "${backends[@]}"; do
  run pipeline "$backend" --devices auto --strategy pipeline --pp 2 --micro-batches 2
  run tp "$backend" --devices auto --strategy model_parallel --tp 2
  run tp_sequence_parallel "$backend" --devices auto --strategy model_parallel --tp 2 \
    --sequence-parallel
done
for name in pipeline tp tp_sequence_parallel; do
  close "$name.shm" single
done
if [[ " ${backends[*]} " == *" nccl "* ]]; then
  for name in pipeline tp tp_sequence_parallel; do
    same "$name.nccl" "$name.shm"
  done
  # 3-D: dp 1 x pp 2 x tp 2, the batch of DDP's two ranks in one replica.
  RANKS=4 BATCH=4 run 3d nccl --devices auto --pp 2 --tp 2 --micro-batches 2
  close 3d.nccl ddp.shm
  # Llama's grouped key/value heads split over tp.
  MODEL=$llama run llama_tp nccl --devices auto --strategy model_parallel --tp 2
  MODEL=$llama single llama_single
  close llama_tp.nccl llama_single
fi
echo "strategies on emulated CUDA: every stage and FSDP equal to DDP, over ${backends[*]}"
