#!/usr/bin/env bash
# train_gpt reads the same tokens however they are stored: a file's bytes (--data FILE), the
# same bytes as an llm.c GPT-2 shard, as two shards named by a glob, and as a nanoGPT raw
# uint16 file (--data-format raw-u16) give the same losses to the bit. --val-data with
# --eval-every reports a validation loss (in the metrics too); bad token files are refused.
#   train_gpt_token_files.sh TRAIN_GPT
set -euo pipefail
T=$1
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
head -c 6000 "$(dirname "$0")/../../README.md" > "$d/text"
python3 - "$d" <<'PY'
import struct, sys
d = sys.argv[1]
data = open(f"{d}/text", "rb").read()
def shard(path, tokens):  # llm.c's layout: 256 int32 header (magic, version, count), uint16s
    header = struct.pack("<3i", 20240520, 1, len(tokens)) + b"\0" * (1024 - 12)
    open(path, "wb").write(header + struct.pack(f"<{len(tokens)}H", *tokens))
shard(f"{d}/all.bin", data)
shard(f"{d}/part_000.bin", data[:2500])
shard(f"{d}/part_001.bin", data[2500:])
open(f"{d}/raw.u16", "wb").write(struct.pack(f"<{len(data)}H", *data))
open(f"{d}/bad_magic.bin", "wb").write(struct.pack("<3i", 1234, 1, 4) + b"\0" * 1012 + b"\0" * 8)
PY
MODEL=(--layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 --steps 4 --log-interval 100)
losses() { grep -o '"loss":[^,}]*' "$1"; }
"$T" "${MODEL[@]}" --data "$d/text" --metrics "$d/bytes.jsonl" > /dev/null
for case in "all.bin" "part_*.bin" "raw.u16 --data-format raw-u16"; do
  read -r file extra <<< "$case"
  "$T" "${MODEL[@]}" --data "$d/$file" $extra --metrics "$d/case.jsonl" > /dev/null
  diff <(losses "$d/bytes.jsonl") <(losses "$d/case.jsonl")
  echo "--data $case: the losses of the bytes"
done
"$T" "${MODEL[@]}" --data "$d/all.bin" --val-data "$d/part_001.bin" --eval-every 2 \
  --eval-batches 3 --metrics "$d/val.jsonl" > "$d/val.log"
grep -q "step 4: val loss" "$d/val.log"
[ "$(grep -c '"val_loss"' "$d/val.jsonl")" = 2 ]
echo "--val-data: a validation loss every 2 steps"
expect_error() {
  local want=$1; shift
  if out=$("$T" "${MODEL[@]}" "$@" 2>&1); then echo "accepted: $*"; exit 1; fi
  grep -qF -- "$want" <<< "$out" || { echo "expected '$want', got: $out"; exit 1; }
}
expect_error "not llmc-gpt2's magic 20240520" --data "$d/bad_magic.bin" --data-format llmc-gpt2
expect_error "matches no file; expected token files" --data "$d/none_*.bin"
expect_error "--eval-every needs --val-data" --eval-every 2
expect_error "--data-format text needs --tokenizer" --data "$d/text" --data-format text
echo "token files read as their bytes"
