#!/usr/bin/env bash
# DDP, ZeRO 1-3 and FSDP, and the CPU offloads, over 2 ranks on the emulated CUDA device: each
# rank is a process of train_gpt_emulated (train_gpt linked against the emulated runtime) with
# an emulated GPU of its own, and the two share it as ranks share one GPU, through the shm
# backend's staging. Every stage and FSDP must train with DDP's losses and write DDP's weights,
# bit for bit (the design's promise, here with CUDA tensors); the offloads must run to the end
# (their update is the CPU's AdamW, which differs from the device's by ulps: docs/cuda.md).
#
#   strategies_on_emulated_cuda.sh LOOMRUN TRAIN_GPT_EMULATED
set -euo pipefail
loomrun=$1
train_gpt=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(--device cuda --layers 2 --heads 2 --embd 32 --ctx 16 --batch 2 --steps 4 --seed 1)

run() {
  local name=$1
  if ! "$loomrun" --nproc-per-node 2 "$train_gpt" "${args[@]}" --strategy "$name" \
      --metrics "$work/$name.jsonl" --save "$work/$name.safetensors" >"$work/$name.log" 2>&1; then
    cat "$work/$name.log"
    echo "strategies_on_emulated_cuda: $name failed"
    exit 1
  fi
}

losses() {
  python3 -c 'import json, sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1])))' "$1"
}

for name in ddp deepspeed_stage_1 deepspeed_stage_2 deepspeed_stage_3 fsdp \
    deepspeed_stage_2_offload fsdp_cpu_offload; do
  run "$name"
done
want=$(losses "$work/ddp.jsonl")
echo "ddp: losses $want"
for name in deepspeed_stage_1 deepspeed_stage_2 deepspeed_stage_3 fsdp; do
  got=$(losses "$work/$name.jsonl")
  [ "$got" = "$want" ] || { echo "$name: losses $got differ from ddp's"; exit 1; }
  cmp -s "$work/ddp.safetensors" "$work/$name.safetensors" ||
    { echo "$name: weights differ from ddp's"; exit 1; }
  echo "$name: losses and weights equal to ddp's"
done
for name in deepspeed_stage_2_offload fsdp_cpu_offload; do
  echo "$name: losses $(losses "$work/$name.jsonl")"
done
echo "strategies on emulated CUDA: every stage and FSDP equal to DDP"
