#!/usr/bin/env bash
# Runs a command; when it fails and its output matches REGEX (a Perl regular expression), the
# run counts as skipped (exit 77, ctest's SKIP_RETURN_CODE): the command said it cannot run on
# this machine, e.g. "no usable GPU". Otherwise its status is passed on. Whether such a skip is
# allowed here is for the skip ledger to say (tests/skips/ledger.toml), never this script.
#   skip_when.sh REGEX COMMAND [ARG...]
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: skip_when.sh REGEX COMMAND [ARG...]" >&2; exit 2; }
regex=$1; shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" > "$out" 2>&1
status=$?
cat "$out"
if [ "$status" -ne 0 ] && grep -Pq -- "$regex" "$out"; then
  echo "skip_when.sh: skipped: the command says it cannot run here (matched: $regex)"
  exit 77
fi
exit "$status"
