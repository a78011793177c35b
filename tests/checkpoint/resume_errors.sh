#!/usr/bin/env bash
# A checkpoint that does not fit the run is refused with a message naming what differs:
# another model, an uncommitted directory, damaged files (a truncated, missing or corrupt
# shard, an index that disagrees with the files), a meta.json whose fields are not of their
# type and range (a negative or float step used to crash the run).
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
"$T" --layers 1 "${M[@]}" --steps 2 --checkpoint-dir "$d/plain" --save-every 1 > /dev/null
expect_error "is a checkpoint of another model" --layers 2 "${M[@]}" --steps 4 --checkpoint-dir "$d/plain" --resume auto
# A meta.json copied from another checkpoint (step 1's into step 2): refused by the directory's
# name, and under another name by the optimizer's step count.
cp -r "$d/plain" "$d/stale"; cp "$d/stale/step-00000001/meta.json" "$d/stale/step-00000002/"
expect_error "meta.json records step 1, but the directory is the checkpoint of step 2" --layers 1 "${M[@]}" --steps 4 --checkpoint-dir "$d/stale" --resume auto
mv "$d/stale/step-00000002" "$d/stale-renamed"
expect_error "meta.json records step 1, but the optimizer state has taken 2 steps" --layers 1 "${M[@]}" --steps 4 --resume "$d/stale-renamed"
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
# meta.json with a field out of its type or range: refused naming meta.json and the field.
meta_edited() {  # name, then a Python statement on the meta.json object `m`
  rm -rf "$d/$1"; cp -r "$d/plain/step-00000002" "$d/$1"
  python3 - "$d/$1/meta.json" "$2" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
exec(sys.argv[2])
json.dump(m, open(sys.argv[1], "w"))
PY
  echo "$d/$1"
}
c=$(meta_edited step_negative 'm["step"] = -5')
expect_error 'meta.json: "step" is -5; expected an integer >= 0' --layers 1 "${M[@]}" --steps 4 --resume "$c"
c=$(meta_edited step_float 'm["step"] = 1e30')
expect_error 'meta.json: "step" is 1e+30; expected an integer >= 0' --layers 1 "${M[@]}" --steps 4 --resume "$c"
c=$(meta_edited version_string 'm["version"] = "2"')
expect_error 'meta.json: "version" is "2"; expected an integer' --layers 1 "${M[@]}" --steps 4 --resume "$c"
c=$(meta_edited world_size_string 'm["world_size"] = "two"')
expect_error 'meta.json: "world_size" is "two"; expected an integer from 1' --layers 1 "${M[@]}" --steps 4 --resume "$c"
c=$(meta_edited heads_zero 'm["model"]["heads"] = 0')
expect_error 'meta.json: "model.heads" is 0; expected an integer >= 1' --layers 1 "${M[@]}" --steps 4 --resume "$c"
printf '[]' > "$(meta_edited array 'pass')/meta.json"
expect_error "meta.json is a JSON array; expected a JSON object" --layers 1 "${M[@]}" --steps 4 --resume "$d/array"
mkdir -p "$d/plain/step-00000009"
expect_error "is not a committed checkpoint" --layers 1 "${M[@]}" --steps 10 --resume "$d/plain/step-00000009"
f="$d/plain/step-00000002/model.safetensors"
printf '\x55' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 3 )) conv=notrunc status=none
expect_error "is corrupt" --layers 1 "${M[@]}" --steps 4 --checkpoint-dir "$d/plain" --resume auto
echo "every unfit checkpoint was refused"
