#!/usr/bin/env bash
# Two runs on one --checkpoint-dir: the second is refused at once, naming the first's host and
# pid (ROOT/.lock, strategies/checkpoint/directory.h), and the first's checkpoints are
# untouched; once the first is gone (SIGKILL: the kernel drops its lock), a run resumes there.
#   lock.sh TRAIN_GPT
set -euo pipefail
T=$1
d=$(mktemp -d)
first=
trap '[ -z "$first" ] || kill -9 "$first" 2> /dev/null || true; rm -rf "$d"' EXIT
M=(--layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 --log-interval 1)
"$T" "${M[@]}" --steps 1000000 --checkpoint-dir "$d/ck" --save-every 1 > "$d/first.log" 2>&1 &
first=$!
for _ in $(seq 200); do  # until the first run has committed a checkpoint
  ls "$d/ck"/step-*/COMMITTED > /dev/null 2>&1 && break
  sleep 0.05
done
ls "$d/ck"/step-*/COMMITTED > /dev/null 2>&1 || { echo "the first run saved nothing"; cat "$d/first.log"; exit 1; }
if "$T" "${M[@]}" --steps 3 --checkpoint-dir "$d/ck" --save-every 1 --resume auto > "$d/second.log" 2>&1; then
  echo "the second run was not refused"; cat "$d/second.log"; exit 1
fi
grep -q "$d/ck is in use by another run (host $(hostname), pid $first)" "$d/second.log" ||
  { echo "the refusal does not name the first run:"; cat "$d/second.log"; exit 1; }
echo "a second run on the directory is refused naming host $(hostname) and pid $first"
kill -9 "$first"; wait "$first" 2> /dev/null || true; first=
latest=$(ls -d "$d/ck"/step-* | sort | tail -1)
steps=$((10#${latest##*step-} + 2))
"$T" "${M[@]}" --steps "$steps" --checkpoint-dir "$d/ck" --resume auto > "$d/third.log" 2>&1 &&
  grep -q "resuming from" "$d/third.log" || { echo "no resume after the first run died:"; cat "$d/third.log"; exit 1; }
echo "after the first run was killed, a run resumes in the directory"
