#!/usr/bin/env bash
# Resume is bitwise: for each configuration, 6 steps straight, and 3 steps with checkpoints
# followed by a resume to 6, give the same per-step losses and gradient norms and the same
# final weights (cmp of the saved files).
# Two save asynchronously (--async-save); the last keeps the optimizer on NVMe. The sharded
# strategies write the sharded format, one the full format (weights gathered).
#   resume_is_bitwise.sh TRAIN_GPT
set -euo pipefail
T=$1
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
MODEL=(--layers 2 --heads 2 --embd 32 --ctx 16 --batch 2 --log-interval 100)
numbers() { grep -o '"\(loss\|grad_norm\)":[^,}]*' "$1"; }
source "$(dirname "$0")/training_flags.sh"
check() {
  local name=$1; shift
  local straight; mapfile -t straight < <(training_flags "$@")
  "$T" "${MODEL[@]}" "${straight[@]}" --steps 6 --metrics "$d/$name.straight.jsonl" --save "$d/$name.straight.st" > /dev/null 2>&1
  "$T" "${MODEL[@]}" "$@" --steps 3 --checkpoint-dir "$d/$name" --save-every 3 > /dev/null 2>&1
  "$T" "${MODEL[@]}" "$@" --steps 6 --checkpoint-dir "$d/$name" --resume auto \
    --metrics "$d/$name.resumed.jsonl" --save "$d/$name.resumed.st" > "$d/$name.log" 2>&1
  grep -q "resuming from" "$d/$name.log" || { echo "$name: did not resume"; cat "$d/$name.log"; exit 1; }
  cmp "$d/$name.straight.st" "$d/$name.resumed.st"
  diff <(numbers "$d/$name.straight.jsonl" | tail -n 6) <(numbers "$d/$name.resumed.jsonl")
  echo "$name: resume is bitwise"
}
check single_device
check single_16mixed --precision 16-mixed
check ddp --strategy ddp_spawn --devices 2
check ddp_shuffled --strategy ddp_spawn --devices 2 --shuffle
check llama_zero3 --model llama --strategy deepspeed_stage_3 --devices 2
check llama_tensor_parallel --model llama --tp 2
check llama_dp --model llama --strategy dp --devices 2
check zero1_bf16 --strategy deepspeed_stage_1 --devices 2 --precision bf16-mixed
check zero3 --strategy deepspeed_stage_3 --devices 2
check zero2_bf16_weights --strategy deepspeed_stage_2 --devices 2 --weights-dtype bf16
check llama_zero3_bf16_weights --model llama --strategy deepspeed_stage_3 --devices 2 --weights-dtype bf16
check zero3_bf16_weights_full_format --strategy deepspeed_stage_3 --devices 2 --weights-dtype bf16 \
  --checkpoint-format full
check zero3_full_format --strategy deepspeed_stage_3 --devices 2 --checkpoint-format full
check pipeline --pp 2 --micro-batches 2
check tensor_parallel --tp 2
check pipeline_16mixed --pp 2 --micro-batches 2 --precision 16-mixed
check tensor_parallel_16mixed --tp 2 --sequence-parallel --precision 16-mixed
check fsdp_offload --strategy fsdp_cpu_offload --devices 2 --wrap-policy Block --optimizer sgd --momentum 0.9
check ddp_async --strategy ddp_spawn --devices 2 --async-save
check zero3_async --strategy deepspeed_stage_3 --devices 2 --async-save
mkdir -p "$d/nvme"
check zero3_nvme --strategy deepspeed_stage_3_offload_nvme --devices 2 --nvme-path "$d/nvme"
echo "all configurations resume bitwise"
