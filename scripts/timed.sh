#!/usr/bin/env bash
# Sourced by the test scripts:
#   timed NAME COMMAND...   runs COMMAND, prints how long it took, and appends "NAME SECONDS"
#                           to $LOOM_TIMES_FILE when set (.ci/run prints them all at the end).
#                           The command's status is returned.
#   beside COMMAND...       starts COMMAND in the background, at the lowest CPU priority
#                           (nice 19) and in a process group of its own, so that it takes only
#                           the CPU the commands in the foreground leave idle (Note [A build
#                           beside the tests] in scripts/sanitize.sh). One at a time.
#   wait_beside             waits for it, then prints its output (kept in a file meanwhile, so
#                           that it does not interleave with the foreground's); returns its
#                           status.
#   stop_beside             kills its whole process group if it is still running (for an EXIT
#                           trap: a script that fails leaves no build running).
timed() {
  local name=$1 start=$SECONDS status=0
  shift
  "$@" || status=$?
  local took=$((SECONDS - start))
  echo "timed: $name took ${took} s$([ "$status" -eq 0 ] || echo " (failed, status $status)")"
  [ -z "${LOOM_TIMES_FILE:-}" ] || echo "$name $took" >> "$LOOM_TIMES_FILE"
  return "$status"
}

beside() {
  # A background job of a script is not a process-group leader, so setsid runs in it (no fork)
  # and $! is the new group's id. A new session is also a new scheduling autogroup where the
  # kernel has them (sched_autogroup_enabled, Debian's default), and autogroups share the CPU
  # fairly whatever their tasks' nice values: measured, the build took half of it from the
  # ASan tests. So the autogroup itself gets nice 19 as well.
  LOOM_BESIDE_LOG=$(mktemp)
  setsid bash -c 'echo 19 2> /dev/null > /proc/self/autogroup || true; exec nice -n 19 "$@"' _ "$@" \
    > "$LOOM_BESIDE_LOG" 2>&1 &
  LOOM_BESIDE_PID=$!
}

wait_beside() {
  local pid=${LOOM_BESIDE_PID:?wait_beside: nothing was started beside} status=0
  LOOM_BESIDE_PID=
  wait "$pid" || status=$?
  cat "$LOOM_BESIDE_LOG"
  rm -f "$LOOM_BESIDE_LOG"
  return "$status"
}

stop_beside() {
  [ -z "${LOOM_BESIDE_PID:-}" ] || kill -- "-$LOOM_BESIDE_PID" 2> /dev/null || true
  [ -z "${LOOM_BESIDE_LOG:-}" ] || rm -f "$LOOM_BESIDE_LOG"
}
