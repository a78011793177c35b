#!/usr/bin/env bash
# loom-perf refuses values outside a flag's range before any rank starts or any size is
# measured: exit status 2 and one line naming the flag, the value and what is accepted.
#   loom_perf_bad_flags.sh LOOM_PERF
set -euo pipefail
P=$1
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
expect_refused() {  # pattern, then the loom-perf arguments
  local pattern=$1; shift
  set +e
  timeout 60 "$P" "$@" > "$d/out" 2>&1
  local rc=$?
  set -e
  if [ "$rc" -ne 2 ]; then echo "exit $rc, expected 2: loom-perf $*"; cat "$d/out"; exit 1; fi
  grep -q -- "$pattern" "$d/out" || { echo "expected '$pattern', got:"; cat "$d/out"; exit 1; }
  if grep -q "Avg bus bandwidth\|step time" "$d/out"; then echo "measured: $*"; exit 1; fi
  echo "refused: $pattern"
}
C=(allreduce -b 8 -e 64 -n 1 -w 0)
expect_refused "stepfactor must be a finite number above 1, got nan" "${C[@]}" -f nan
expect_refused "stepfactor must be a finite number above 1, got inf" "${C[@]}" -f inf
expect_refused "stepfactor must be a finite number above 1, got 1;" "${C[@]}" -f 1
expect_refused "\-\-timeout must be a number of seconds above 0 and at most 31536000 (a year)" \
  "${C[@]}" --timeout nan
expect_refused "\-\-timeout .* got 1e+30" "${C[@]}" --timeout 1e30
expect_refused "\-\-timeout .* got inf" "${C[@]}" --timeout inf
expect_refused "\-\-timeout .* got 0" "${C[@]}" --timeout 0
expect_refused "\-\-compute-us needs -z 2" "${C[@]}" --compute-us 100
expect_refused "\-\-compute-us must be a finite number of microseconds, 0 or more, got -1" \
  "${C[@]}" -z 2 --compute-us -1
S=(strategy --layers 1 --heads 1 --embd 16 --ctx 16 --steps 3)
expect_refused "\-\-batch: Value -1 not in range 1 to 16777216" "${S[@]}" --batch -1
expect_refused "\-\-batch: Value 0 not in range" "${S[@]}" --batch 0
expect_refused "\-\-grad-accum: Value 0 not in range 1 to 65536" "${S[@]}" --grad-accum 0
expect_refused "\-\-grad-accum: Value -1 not in range" "${S[@]}" --grad-accum -1
expect_refused "\-\-warmup: Value -5 not in range 0 to" "${S[@]}" --warmup -5
expect_refused "\-\-steps: Value 1 not in range 2 to" "${S[@]}" --steps 1
