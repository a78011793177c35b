#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz in the asan preset's tree (build/asan: clang 14,
# ASan + UBSan, CUDA off; the harnesses are part of that build) and runs each for SECONDS
# (default 30) on a copy of its seed corpus, so that the checked-in corpus never grows:
#
#   scripts/fuzz.sh [SECONDS_PER_HARNESS] [HARNESS...]     e.g. scripts/fuzz.sh 150 safetensors
#
# HARNESS names a tests/fuzz/fuzz_<HARNESS>.cpp (all of them by default). Prints one line
# per harness: executions, seconds, crashes (a crash, a sanitizer report, an exception
# outside the parser's contract, a timeout over 10 s or a memory use over 2 GiB). Exits 1
# if any harness crashed, with the input that did it kept under build/asan/fuzz-findings/ and its
# path printed, with the command that reproduces it (build/asan/tests/fuzz/fuzz_<HARNESS>
# PATH, in a TMPDIR of its own: a harness that dies leaves its scratch directory behind).
# The build runs niced on CMAKE_BUILD_PARALLEL_LEVEL jobs (default 2), the harnesses niced,
# FUZZ_JOBS at a time (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-30}
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [SECONDS_PER_HARNESS] [HARNESS...]" >&2; exit 2; }
shift $(( $# > 0 ? 1 : 0 ))
if [ $# -gt 0 ]; then
  harnesses=("$@")
else
  harnesses=()
  for source in tests/fuzz/fuzz_*.cpp; do
    name=${source#tests/fuzz/fuzz_}
    harnesses+=("${name%.cpp}")
  done
fi
for name in "${harnesses[@]}"; do
  [ -f "tests/fuzz/fuzz_$name.cpp" ] || { echo "$0: no harness tests/fuzz/fuzz_$name.cpp" >&2; exit 2; }
done

build=build/asan
cmake --preset asan > /dev/null
targets=()
for name in "${harnesses[@]}"; do targets+=(--target "fuzz_$name"); done
nice -n 10 cmake --build "$build" "${targets[@]}" --parallel "${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
# The build makes every UBSan report abort already; ASan's leak check stays on.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}

# Working corpora and the harnesses' scratch files ($TMPDIR, tests/fuzz/fuzz_support.h) live
# here, removed at exit even when a harness died without cleaning up.
work=$(mktemp -d "${TMPDIR:-/tmp}/loom-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
findings="$build/fuzz-findings"

# One harness: its line (and, after a crash, what it found) into $work/report-NAME, and
# $work/crashed-NAME if it crashed.
run_harness() {
  local name=$1 corpus="$work/corpus-$1" scratch="$work/tmp-$1"
  mkdir -p "$corpus" "$scratch" "$findings/$name"
  [ -d "tests/fuzz/corpus/$name" ] && cp -r "tests/fuzz/corpus/$name/." "$corpus/"
  local dict=()
  [ -f "tests/fuzz/$name.dict" ] && dict=(-dict="tests/fuzz/$name.dict")
  local log="$findings/$name/last-run.log"
  local before start status=0
  before=$(find "$findings/$name" -type f ! -name '*.log' | sort)
  start=$(date +%s)
  TMPDIR="$scratch" nice -n 10 "$build/tests/fuzz/fuzz_$name" "$corpus" "${dict[@]}" \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$findings/$name/" > "$log" 2>&1 || status=$?
  local elapsed=$(( $(date +%s) - start )) runs new count
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1 || true)
  new=$(comm -13 <(echo "$before") <(find "$findings/$name" -type f ! -name '*.log' | sort) | sed '/^$/d')
  count=$(printf '%s' "$new" | grep -c . || true)
  if [ "$status" -ne 0 ] && [ "$count" -eq 0 ]; then count=1; fi  # died without an artifact
  {
    printf '%-20s %12s executions %6s s %3s crashes\n' "$name" "${runs:-?}" "$elapsed" "$count"
    if [ "$count" -gt 0 ]; then
      grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|.*uncaught exception|.*deadly signal|.*Test unit written)' \
        "$log" | head -8 | sed 's/^/    /' || true
      if [ -n "$new" ]; then
        while read -r input; do
          echo "    crash input: $input"
          echo "    reproduce:   (t=\$(mktemp -d); TMPDIR=\$t $build/tests/fuzz/fuzz_$name $input; rm -rf \$t)"
        done <<< "$new"
      fi
      echo "    log: $log"
    fi
  } > "$work/report-$name"
  [ "$count" -eq 0 ] || touch "$work/crashed-$name"
}

# FUZZ_JOBS harnesses at a time (default: one per core), each a single-threaded libFuzzer run
# of SECONDS; the lines come out in the harnesses' order.
parallel=${FUZZ_JOBS:-$(nproc)}
[[ "$parallel" =~ ^[1-9][0-9]*$ ]] || { echo "$0: FUZZ_JOBS must be a positive integer, not '$parallel'" >&2; exit 2; }
for name in "${harnesses[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
  run_harness "$name" &
done
wait
crashed=0
for name in "${harnesses[@]}"; do
  cat "$work/report-$name"
  [ ! -e "$work/crashed-$name" ] || crashed=1
done
exit "$crashed"
