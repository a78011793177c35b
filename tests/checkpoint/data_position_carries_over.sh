#!/usr/bin/env bash
# The data position carries over to another world size: with --lr 0 the weights never change,
# so a step's loss names the block it read. Two steps of ddp over 2 ranks read positions 0-3;
# resumed on 1 rank, steps 3 and 4 must read positions 4 and 5, the blocks of steps 5 and 6 of
# a straight single-rank run (with and without --shuffle). A Llama saved by ZeRO-3 (the sharded
# format) and resumed on 1 rank does the same: its weights resharded, its data order kept.
#   data_position_carries_over.sh TRAIN_GPT
set -euo pipefail
T=$1
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
MODEL=(--layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 --lr 0 --log-interval 100)
losses() { grep -o '"loss":[^,}]*' "$1"; }
check() {
  local name=$1 strategy=$2; shift 2
  "$T" "${MODEL[@]}" "$@" --steps 6 --metrics "$d/$name.straight.jsonl" > /dev/null 2>&1
  "$T" "${MODEL[@]}" "$@" --strategy "$strategy" --devices 2 --steps 2 \
    --checkpoint-dir "$d/$name" --save-every 2 > /dev/null 2>&1
  "$T" "${MODEL[@]}" "$@" --steps 4 --checkpoint-dir "$d/$name" --resume auto \
    --metrics "$d/$name.resumed.jsonl" > "$d/$name.log" 2>&1
  grep -q "resuming from" "$d/$name.log" || { echo "$name: did not resume"; cat "$d/$name.log"; exit 1; }
  diff <(losses "$d/$name.straight.jsonl" | sed -n 5,6p) <(losses "$d/$name.resumed.jsonl")
  echo "$name: steps 3-4 on 1 rank read positions 4-5"
}
check ddp_in_order ddp_spawn
check ddp_shuffled ddp_spawn --shuffle
check llama_zero3_shuffled deepspeed_stage_3 --model llama --shuffle
echo "the data position carries over from 2 ranks to 1"
