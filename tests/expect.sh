#!/usr/bin/env bash
# Runs a command and checks both how it ended and what it printed at the end of its run, for
# ctest (whose PASS_REGULAR_EXPRESSION alone ignores the exit status, so a program that
# crashed after printing the expected line would pass):
#   expect.sh EXIT REGEX COMMAND [ARG...]
# EXIT: the status the command must end with: a number, or "nonzero" for any failure that is
# not a signal (1-125). REGEX: a Perl regular expression that stdout and stderr together
# must match, with "." also matching newlines (so "A.*B" means A, later B). Exit status 77
# (ctest's skip code, SKIP_RETURN_CODE) passes through when EXIT is not 77: the command
# skipped itself and said why. The command's output is shown whatever happens.
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: expect.sh EXIT REGEX COMMAND [ARG...]" >&2; exit 2; }
want=$1; regex=$2; shift 2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" > "$out" 2>&1
status=$?
cat "$out"
if [ "$status" -eq 77 ] && [ "$want" != 77 ]; then
  exit 77
fi
case "$want" in
  nonzero) [ "$status" -ge 1 ] && [ "$status" -le 125 ] ||
    { echo "expect.sh: the command ended with status $status, expected a failure (1-125)"; exit 1; } ;;
  *) [ "$status" -eq "$want" ] ||
    { echo "expect.sh: the command ended with status $status, expected $want"; exit 1; } ;;
esac
grep -Pzq -- "(?s)$regex" "$out" ||
  { echo "expect.sh: the output does not match: $regex"; exit 1; }
