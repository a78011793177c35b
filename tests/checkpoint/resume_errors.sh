#!/usr/bin/env bash
# A checkpoint that does not fit the run is refused with a message naming what differs:
# another model, an uncommitted directory, damaged files (a truncated, missing or corrupt
# shard, an index that disagrees with the files).
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
# A sharded checkpoint (ZeRO-3 on 2 ranks) whose files were damaged after the save: copies of
# it with a shard truncated, a shard deleted, a flipped byte, an index that lost a shard.
"$T" --layers 1 "${M[@]}" --steps 2 --strategy deepspeed_stage_3 --devices 2 --checkpoint-dir "$d/z3" --save-every 2 > /dev/null 2>&1
damaged() {  # name: a copy of the z3 run to damage
  rm -rf "$d/$1"; cp -r "$d/z3" "$d/$1"; echo "$d/$1/step-00000002"
}
c=$(damaged truncated); truncate -s -8 "$c/rank-00001.safetensors"
expect_error "rank-00001.safetensors is .* bytes; index.json recorded .* (truncated" --layers 1 "${M[@]}" --steps 4 --resume "$c"
c=$(damaged missing); rm "$c/rank-00001.safetensors"
expect_error "rank-00001.safetensors, listed in index.json, is missing" --layers 1 "${M[@]}" --steps 4 --resume "$c"
c=$(damaged flipped); f="$c/rank-00000.safetensors"
printf '\x55' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 3 )) conv=notrunc status=none
expect_error "rank-00000.safetensors: tensor '.*' is corrupt" --layers 1 "${M[@]}" --steps 4 --resume "$c"
c=$(damaged unindexed)
python3 - "$c/index.json" <<'PY'
import json, sys
index = json.load(open(sys.argv[1]))
entry = index["tensors"]["wte.weight"]
entry["shards"] = [s for s in entry["shards"] if s["file"] != "rank-00001.safetensors"]
json.dump(index, open(sys.argv[1], "w"))
PY
expect_error "tensor 'wte.weight' of shape .* has shards for its first .* elements only; a shard file is missing" --layers 1 "${M[@]}" --steps 4 --resume "$c"
mkdir -p "$d/plain/step-00000009"
expect_error "is not a committed checkpoint" --layers 1 "${M[@]}" --steps 10 --resume "$d/plain/step-00000009"
f="$d/plain/step-00000002/model.safetensors"
printf '\x55' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 3 )) conv=notrunc status=none
expect_error "is corrupt" --layers 1 "${M[@]}" --steps 4 --checkpoint-dir "$d/plain" --resume auto
echo "every unfit checkpoint was refused"
