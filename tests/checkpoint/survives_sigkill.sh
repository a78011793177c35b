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
# Kill times are fractions of the uninterrupted run's wall time, so that a slow build (ASan)
# or a slow host still sees kills after the first checkpoint, not only during start-up.
start=$(date +%s%N)
"$T" "${STRAIGHT[@]}" --save "$d/straight.st" > /dev/null
straight_ms=$((($(date +%s%N) - start) / 1000000))
RANDOM=7  # the same kill fractions on every run of the test
for i in $(seq 1 "$KILLS"); do
  "$T" "${ARGS[@]}" --checkpoint-dir "$d/ck" --save-every 1 --keep-last 2 --resume auto \
    > "$d/run$i.log" 2>&1 &
  pid=$!
  kill_ms=$((straight_ms * (RANDOM % 120 + 10) / 100))
  sleep "$((kill_ms / 1000)).$(printf '%03d' $((kill_ms % 1000)))"
  kill -9 "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
done
"$T" "${ARGS[@]}" --checkpoint-dir "$d/ck" --save-every 1 --keep-last 2 --resume auto \
  --save "$d/resumed.st" > "$d/final.log" 2>&1
resumes=$(cat "$d"/run*.log "$d/final.log" | grep -c "resuming from" || true)
echo "resumes: $resumes"
if [ "$resumes" = 0 ]; then
  echo "no run was killed after its first checkpoint (the uninterrupted run took" \
    "${straight_ms} ms): this run tested nothing" >&2
  exit 1
fi
cmp "$d/straight.st" "$d/resumed.st"
echo "after $KILLS kills: the same weights as the uninterrupted run"
