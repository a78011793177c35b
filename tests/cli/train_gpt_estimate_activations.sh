#!/usr/bin/env bash
# --estimate-memory predicts the activations from one micro-batch run on the meta device
# (tensor/meta.h): the CPU path's tensors, so a real run's peak of activations (its metrics'
# peak_bytes_by_kind) is the prediction to the byte, for GPT-2 and Llama, 32-true and the
# mixed precisions, with activation checkpointing, gradient accumulation, and on 2 ranks.
#   train_gpt_estimate_activations.sh TRAIN_GPT
set -euo pipefail
T=$1
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
check() {  # the train_gpt arguments of one configuration
  local predicted measured
  predicted=$("$T" "$@" --estimate-memory | sed -n 's/^  activations .*(\([0-9]*\) bytes.*/\1/p')
  "$T" "$@" --steps 2 --log-interval 100 --metrics "$d/m.jsonl" > "$d/out" 2>&1 ||
    { cat "$d/out"; exit 1; }
  measured=$(tail -1 "$d/m.jsonl" | sed 's/.*"activations":\([0-9]*\).*/\1/')
  if [ -z "$predicted" ] || [ "$predicted" != "$measured" ]; then
    echo "predicted '$predicted' bytes of activations, measured $measured: $*"; exit 1
  fi
  echo "activations $measured bytes, as predicted: $*"
}
M=(--layers 2 --heads 2 --embd 32 --ctx 32 --batch 4)
check "${M[@]}"
check "${M[@]}" --precision bf16-mixed --grad-accum 2
check "${M[@]}" --activation-checkpointing Block --precision 16-mixed
check "${M[@]}" --model llama --kv-heads 1 --intermediate 48
check "${M[@]}" --model llama --kv-heads 1 --activation-checkpointing LlamaDecoderLayer
check "${M[@]}" --strategy deepspeed_stage_3 --devices 2 --precision bf16-mixed
echo "every activation estimate was exact"
