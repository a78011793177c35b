#!/usr/bin/env bash
# ddp_spawn (strategies/local_launch.h) end to end: a bad --process-group-backend is refused
# before any rank starts; a group that cannot be set up (a bad LOOM_SHM_* value) is refused
# with the variable named and nothing left running or in /dev/shm; ranks die with a killed
# rank 0. Every run carries a marker variable, which its ranks inherit: that is how leftover
# processes are found; and a job id (LOOM_JOB_ID) of its own, which names its segments: that
# is how its leftover segments are told from those of tests running beside it.
#   ddp_spawn_failures.sh TRAIN_GPT
set -euo pipefail
T=$1
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
marker="LOOM_DDP_SPAWN_TEST=$$"
job="ddpspawntest$$"
M=(--layers 1 --heads 1 --embd 16 --ctx 16 --batch 2 --strategy ddp_spawn --devices 2 --device cpu)

# Processes (not zombies, whose environment is empty) that carry this run's marker.
leftovers() {
  { grep -l -s -z -x -- "$marker" /proc/[0-9]*/environ || true; } |
    sed 's|/proc/||; s|/environ||' | tr '\n' ' '
}
shm_segments() { ls /dev/shm | grep "^loom-$job-" || true; }

expect_refused() {  # pattern, then environment assignments and train_gpt flags
  local pattern=$1; shift
  set +e
  timeout 60 env "$marker" LOOM_JOB_ID="$job" "$@" > "$d/out" 2>&1
  local rc=$?
  set -e
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then echo "exit $rc: $*"; cat "$d/out"; exit 1; fi
  grep -q -- "$pattern" "$d/out" || { echo "expected '$pattern', got:"; cat "$d/out"; exit 1; }
  local left; left=$(leftovers)
  [ -z "${left// /}" ] || { echo "processes left behind: $left ($*)"; exit 1; }
  [ -z "$(shm_segments)" ] || { echo "/dev/shm left: $(shm_segments) ($*)"; exit 1; }
  echo "refused ($rc), nothing left: $pattern"
}

expect_refused "unknown backend 'mpi'; did you mean '[a-z]*'? Available: " \
  "$T" "${M[@]}" --steps 2 --process-group-backend mpi
expect_refused "unknown backend 'gloo'" \
  "$T" "${M[@]}" --steps 2 --process-group-backend gloo
expect_refused "'nccl' needs CUDA devices, but the ranks run on cpu\|backend 'nccl' is not in this build" \
  "$T" "${M[@]}" --steps 2 --process-group-backend nccl
expect_refused "LOOM_SHM_SLICE_BYTES='abc' is not a number of bytes" \
  LOOM_SHM_SLICE_BYTES=abc "$T" "${M[@]}" --steps 2
expect_refused "LOOM_SHM_CHANNEL_BYTES=18446744073709551615 is out of range" \
  LOOM_SHM_CHANNEL_BYTES=18446744073709551615 "$T" "${M[@]}" --steps 2
expect_refused "LOOM_DEBUG='verbose' is not a known setting" \
  LOOM_DEBUG=verbose "$T" "${M[@]}" --steps 2

# Rank 0 killed while training: its ranks must follow it.
env "$marker" "$T" "${M[@]}" --steps 1000000 --log-interval 1 > "$d/long" 2>&1 &
rank0=$!
for _ in $(seq 200); do grep -q "^step 1/" "$d/long" && break; sleep 0.1; done
grep -q "^step 1/" "$d/long" || { echo "the long run did not start:"; cat "$d/long"; exit 1; }
kill -9 "$rank0"; wait "$rank0" 2>/dev/null || true
for _ in $(seq 50); do [ -z "$(leftovers | tr -d " ")" ] && break; sleep 0.1; done
left=$(leftovers)
[ -z "${left// /}" ] || { echo "ranks outlived a killed rank 0: $left"; kill -9 $left; exit 1; }
echo "ranks died with rank 0"
