#!/usr/bin/env bash
# A checkpoint survives SIGKILL at any moment: a run saving every step is killed at random
# times, resumed with --resume auto each time, and finally its weights equal an uninterrupted
# run's, bitwise. Every resume reads (and checksums) the newest committed checkpoint.
#   survives_sigkill.sh TRAIN_GPT [KILLS [EXTRA TRAIN_GPT FLAGS...]]
set -euo pipefail
T=$1; KILLS=${2:-8}; shift 2 || shift $#
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
ARGS=(--layers 2 --heads 2 --embd 64 --ctx 32 --batch 4 --steps 40 --log-interval 100 "$@")
source "$(dirname "$0")/training_flags.sh"
mapfile -t STRAIGHT < <(training_flags "${ARGS[@]}")
"$T" "${STRAIGHT[@]}" --save "$d/straight.st" > /dev/null
RANDOM=7  # the same kill times on every run of the test
for i in $(seq 1 "$KILLS"); do
  "$T" "${ARGS[@]}" --checkpoint-dir "$d/ck" --save-every 1 --keep-last 2 --resume auto \
    > "$d/run$i.log" 2>&1 &
  pid=$!
  sleep "0.$(printf '%02d' $((RANDOM % 60 + 5)))"
  kill -9 "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
done
"$T" "${ARGS[@]}" --checkpoint-dir "$d/ck" --save-every 1 --keep-last 2 --resume auto \
  --save "$d/resumed.st" > "$d/final.log" 2>&1
grep -h "resuming from" "$d"/run*.log "$d/final.log" | wc -l | xargs echo "resumes:"
cmp "$d/straight.st" "$d/resumed.st"
echo "after $KILLS kills: the same weights as the uninterrupted run"
