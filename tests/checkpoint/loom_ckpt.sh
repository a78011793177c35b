#!/usr/bin/env bash
# loom-ckpt on a real checkpoint: inspect names the step and tensors, verify passes, a
# flipped byte makes verify fail naming the tensor, diff of a checkpoint with itself is
# equal and against the previous step is not; damaged or edited checkpoints (a header, the
# index, meta.json) and an unknown subcommand are refused naming what is wrong.
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
# Refusals: copies of step 2, damaged one way each; the message must name what is wrong.
refused() {  # pattern, then the loom-ckpt arguments
  local pattern=$1; shift
  set +e; "$C" "$@" > "$d/out" 2>&1; local rc=$?; set -e
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ]; then echo "exit $rc for: $*"; cat "$d/out"; exit 1; fi
  grep -q -- "$pattern" "$d/out" || { echo "expected '$pattern', got:"; cat "$d/out"; exit 1; }
}
damaged() {  # name: a fresh copy of step 2
  rm -rf "$d/$1"; cp -r "$d/ck/step-00000002" "$d/$1"; echo "$d/$1"
}
edit_json() {  # file, then a Python statement on `j`
  python3 - "$1" "$2" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
exec(sys.argv[2])
json.dump(j, open(sys.argv[1], "w"))
PY
}
refused "unknown subcommand 'repair'; expected one of inspect, verify, diff, convert" repair "$d/ck"
c=$(damaged header); printf '#' | dd of="$c/model.safetensors" bs=1 seek=9 conv=notrunc status=none
refused "model.safetensors: header is not valid JSON" verify "$c"
c=$(damaged removed); edit_json "$c/index.json" 'del j["tensors"]["h.0.ln_1.weight"]'
refused "index.json does not list tensor 'h.0.ln_1.weight'" inspect "$c"
c=$(damaged reshaped); edit_json "$c/index.json" 'j["tensors"]["h.0.ln_1.weight"]["shape"] = [4, 4]'
refused "index.json says tensor 'h.0.ln_1.weight' is f32 \[4,4\]; the header of model.safetensors says f32 \[16\]" verify "$c"
c=$(damaged outside); edit_json "$c/index.json" '
j["files"]["../x.safetensors"] = j["files"].pop("model.safetensors")
for t in j["tensors"].values():
    for s in t["shards"]:
        s["file"] = "../x.safetensors" if s["file"] == "model.safetensors" else s["file"]'
refused "file '../x.safetensors' is not the plain name of a file in the checkpoint" diff "$c" "$c"
c=$(damaged version); edit_json "$c/meta.json" 'j["version"] = 3'
refused "meta.json has format version 3" convert "$c" "$d/converted" --to full
c=$(damaged step); edit_json "$c/meta.json" 'j["step"] = "2"'
refused "meta.json: \"step\" is \"2\"; expected an integer >= 0" inspect "$c"
refused "meta.json: \"step\" is \"2\"; expected an integer >= 0" verify "$c"
c=$(damaged optimizer); edit_json "$c/meta.json" 'j["optimizer"] = 5'
refused "meta.json: \"optimizer\" is 5; expected a string" convert "$c" "$d/converted" --to sharded --world-size 2
c=$(damaged stale-meta); edit_json "$c/meta.json" 'j["step"] = j["step"] - 1'
refused "meta.json records step [0-9]*, but the optimizer state has taken [0-9]* steps" verify "$c"
echo "loom-ckpt: inspect, verify and diff work"
