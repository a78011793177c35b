#!/usr/bin/env bash
# A checkpoint that does not fit the run is refused with a message naming what differs:
# another model, sharded optimizer state under another world size, an uncommitted directory,
# a corrupt file.
#   resume_errors.sh TRAIN_GPT
set -euo pipefail
T=$1
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
M=(--heads 2 --embd 16 --ctx 16 --batch 2 --log-interval 100)
expect_error() {  # pattern, then the train_gpt arguments
  local pattern=$1; shift
  if "$T" "$@" > "$d/out" 2>&1; then echo "accepted: $*"; exit 1; fi
  grep -q -- "$pattern" "$d/out" || { echo "expected '$pattern', got:"; cat "$d/out"; exit 1; }
  echo "refused: $pattern"
}
"$T" --layers 1 "${M[@]}" --steps 2 --checkpoint-dir "$d/plain" --save-every 2 > /dev/null
expect_error "is a checkpoint of another model" --layers 2 "${M[@]}" --steps 4 --checkpoint-dir "$d/plain" --resume auto
"$T" --layers 1 "${M[@]}" --steps 2 --strategy deepspeed_stage_3 --devices 2 --checkpoint-dir "$d/z3" --save-every 2 > /dev/null 2>&1
expect_error "resume it with the same --strategy and --devices" --layers 1 "${M[@]}" --steps 4 --checkpoint-dir "$d/z3" --resume auto
mkdir -p "$d/plain/step-00000009"
expect_error "is not a committed checkpoint" --layers 1 "${M[@]}" --steps 10 --resume "$d/plain/step-00000009"
f="$d/plain/step-00000002/model.safetensors"
printf '\x55' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 3 )) conv=notrunc status=none
expect_error "is corrupt" --layers 1 "${M[@]}" --steps 4 --checkpoint-dir "$d/plain" --resume auto
echo "every unfit checkpoint was refused"
