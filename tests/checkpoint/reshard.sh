#!/usr/bin/env bash
# Resharding with train_gpt (docs/checkpoints.md): a checkpoint resumes under another
# strategy, and (converted by loom-ckpt) in another format, bitwise as the uninterrupted run
# on the same world size; under another world size it resumes from the same state.
#   reshard.sh TRAIN_GPT LOOM_CKPT
set -euo pipefail
T=$1; C=$2
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
M=(--layers 2 --heads 2 --embd 32 --ctx 16 --batch 2 --log-interval 100)
two() { "$T" "${M[@]}" --devices 2 "$@" > "$d/log" 2>&1 || { cat "$d/log"; exit 1; }; }
# The uninterrupted runs, saving at step 3: DDP (full format), ZeRO-3 (sharded format).
two --strategy ddp_spawn --steps 6 --save "$d/straight.st" --checkpoint-dir "$d/ddp" --save-every 3
two --strategy deepspeed_stage_3 --steps 6 --save "$d/z3.st" --checkpoint-dir "$d/z3" --save-every 3
cmp "$d/straight.st" "$d/z3.st"  # (ZeRO-3 is bitwise DDP)
resumed() {  # name, checkpoint, then the strategy's flags: resumes to step 6 on 2 ranks
  local name=$1 from=$2; shift 2
  two "$@" --steps 6 --resume "$from" --save "$d/$name.st"
  grep -q "resuming from" "$d/log"
  cmp "$d/straight.st" "$d/$name.st"
  echo "$name: bitwise the uninterrupted run"
}
resumed ddp_to_zero3 "$d/ddp/step-00000003" --strategy deepspeed_stage_3
resumed ddp_to_fsdp_blocks "$d/ddp/step-00000003" --strategy fsdp --wrap-policy Block
resumed zero3_to_ddp "$d/z3/step-00000003" --strategy ddp_spawn
resumed zero3_to_zero1 "$d/z3/step-00000003" --strategy deepspeed_stage_1
# loom-ckpt convert: sharded -> full, full -> sharded over 3 rank files; same tensors.
"$C" convert "$d/z3/step-00000003" "$d/z3_full" --to full > /dev/null
"$C" convert "$d/ddp/step-00000003" "$d/ddp_sharded3" --to sharded --world-size 3 > /dev/null
"$C" diff "$d/z3/step-00000003" "$d/z3_full" > "$d/diff1"
"$C" diff "$d/ddp/step-00000003" "$d/ddp_sharded3" > "$d/diff2"
grep -q "the checkpoints are equal" "$d/diff1"
grep -q "the checkpoints are equal" "$d/diff2"
test -f "$d/z3_full/model.safetensors"
test -f "$d/ddp_sharded3/rank-00002.safetensors"
resumed converted_full_to_ddp "$d/z3_full" --strategy ddp_spawn
resumed converted_sharded_to_zero2 "$d/ddp_sharded3" --strategy deepspeed_stage_2
# A pipeline's checkpoint (2 stages, the tied wte on both, written once) resumes under
# ZeRO-3 on 2 ranks from the same state: diff against the single-device conversion.
"$T" "${M[@]}" --pp 2 --micro-batches 2 --steps 3 --checkpoint-dir "$d/pp" --save-every 3 > "$d/log" 2>&1
"$C" convert "$d/pp/step-00000003" "$d/pp_full" --to full > /dev/null
"$C" diff "$d/pp/step-00000003" "$d/pp_full" > "$d/diff3"
grep -q "the checkpoints are equal" "$d/diff3"
two --strategy deepspeed_stage_3 --steps 4 --resume "$d/pp/step-00000003"
grep -q "resuming from .* (3 steps done, saved by pipeline on 2 rank(s))" "$d/log"
# A tensor-parallel checkpoint (blocks of columns and rows) resumes under DDP on 2 ranks, and
# a DDP checkpoint under --tp 2.
"$T" "${M[@]}" --tp 2 --steps 3 --checkpoint-dir "$d/tp" --save-every 3 > "$d/log" 2>&1
two --strategy ddp_spawn --steps 4 --resume "$d/tp/step-00000003"
grep -q "resuming from .* (3 steps done, saved by model_parallel on 2 rank(s))" "$d/log"
two --tp 2 --steps 4 --resume "$d/ddp/step-00000003"
grep -q "resuming from .* (3 steps done, saved by ddp_spawn on 2 rank(s))" "$d/log"
# Another world size: one rank, and ZeRO-3 on 3 ranks, go on from step 3.
"$T" "${M[@]}" --steps 6 --resume "$d/z3/step-00000003" > "$d/log" 2>&1
grep -q "resuming from .* (3 steps done, saved by deepspeed_stage_3 on 2 rank(s))" "$d/log"
"$T" "${M[@]}" --steps 6 --strategy deepspeed_stage_3 --devices 3 --resume "$d/ddp/step-00000003" > "$d/log" 2>&1
grep -q "resuming from .* (3 steps done, saved by ddp_spawn on 2 rank(s))" "$d/log"
echo "every checkpoint resharded"
