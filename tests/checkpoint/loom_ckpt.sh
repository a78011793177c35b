#!/usr/bin/env bash
# loom-ckpt on a real checkpoint: inspect names the step and tensors, verify passes, a
# flipped byte makes verify fail naming the tensor, diff of a checkpoint with itself is
# equal and against the previous step is not.
#   loom_ckpt.sh TRAIN_GPT LOOM_CKPT
set -euo pipefail
T=$1; C=$2
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
"$T" --layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 --steps 4 --checkpoint-dir "$d/ck" --save-every 2 > /dev/null
# (Outputs go to files first: grep -q closing a pipe early would fail the writer under pipefail.)
"$C" inspect "$d/ck" > "$d/inspect.txt"
grep -q "step 4, strategy single_device on 1 rank(s), optimizer adamw" "$d/inspect.txt"
grep -q "wte.weight *f32 *\[256, 16\]" "$d/inspect.txt"
"$C" verify "$d/ck" > "$d/verify.txt"
grep -q "every checksum matches" "$d/verify.txt"
"$C" diff "$d/ck/step-00000004" "$d/ck" > "$d/diff.txt"
grep -q "the checkpoints are equal" "$d/diff.txt"
if "$C" diff "$d/ck/step-00000002" "$d/ck/step-00000004" > /dev/null; then echo "diff saw no change"; exit 1; fi
f="$d/ck/step-00000004/model.safetensors"
size=$(stat -c %s "$f")
printf '\x55' | dd of="$f" bs=1 seek=$((size - 3)) conv=notrunc status=none  # into the last tensor
if "$C" verify "$d/ck" 2> "$d/err"; then echo "verify missed a flipped byte"; exit 1; fi
grep "is corrupt" "$d/err" || { echo "verify failed without naming the corrupt tensor"; cat "$d/err"; exit 1; }
echo "loom-ckpt: inspect, verify and diff work"
