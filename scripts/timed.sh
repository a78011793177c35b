#!/usr/bin/env bash
# Sourced by the test scripts: `timed NAME COMMAND...` runs COMMAND, prints how long it took,
# and appends "NAME SECONDS" to $LOOM_TIMES_FILE when set (.ci/run prints them all at the
# end). The command's status is returned.
timed() {
  local name=$1 start=$SECONDS status=0
  shift
  "$@" || status=$?
  local took=$((SECONDS - start))
  echo "timed: $name took ${took} s$([ "$status" -eq 0 ] || echo " (failed, status $status)")"
  [ -z "${LOOM_TIMES_FILE:-}" ] || echo "$name $took" >> "$LOOM_TIMES_FILE"
  return "$status"
}
