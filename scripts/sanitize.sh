#!/usr/bin/env bash
# The sanitizer runs (CI runs this after scripts/test.sh; docs/reliability.md):
#   1. the whole test suite built with AddressSanitizer + UndefinedBehaviorSanitizer
#      (preset asan: -O1 -g, CUDA off; any UBSan report aborts the test);
#   2. the comm, launcher and strategy tests (ctest labels "comm" and "strategies", less those
#      labelled "single_thread", which run on one thread) built with ThreadSanitizer (preset
#      tsan);
#   3. every libFuzzer harness (built in step 1's tree) for FUZZ_SECONDS (default 10) each
#      (scripts/fuzz.sh).
# Each step prints how long it took, and each ctest run's skips are judged against the skip
# ledger (tests/skips/check_skips.py). Needs scripts/install-deps.sh's packages.
#   scripts/sanitize.sh [asan|tsan|fuzz ...]     (default: all three)
# asan is build-asan then test-asan, tsan is build-tsan then test-tsan; .ci/run runs
# build-asan beside the campaigns, then test-asan tsan fuzz.
#
# Note [A build beside the tests]
# A test suite leaves part of the machine idle (about 10% of 2 cores in the ASan suite, where
# ranks wait for each other and for timeouts; half of it in the reliability campaigns), and
# the next build needs nothing from it. So where both sanitizers run, the TSan build starts
# beside the ASan tests (`beside` in scripts/timed.sh: nice 19, its own process group, its
# output printed when it is waited for), and .ci/run builds ASan beside the campaigns. Since
# the emulated kernels got faster (2026-12-08) the TSan build outlasts the ASan tests, so the
# fuzz harnesses run next, before it is waited for. The
# tests keep their priority: a compile job gets a core only while no test process wants it.
# Each part's time is still printed; they overlap, so .ci/run prints the wall-clock total too.
set -euo pipefail
cd "$(dirname "$0")/.."

# Reports go to stderr, where ctest keeps them with the failing test's output. UBSan stops at
# its first report (halt_on_error), as ASan always does; TSan's exit code is its own (66).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

source scripts/timed.sh

build_asan() {
  timed "asan configure+build" bash -c 'cmake --preset asan > /dev/null && cmake --build --preset asan'
}

build_tsan() {
  timed "tsan configure+build" bash -c 'cmake --preset tsan > /dev/null &&
    cmake --build --preset tsan --target loom_comm_tests loom_strategy_tests'
}

test_asan() {
  timed "asan ctest" ctest --preset asan -j2 --output-on-failure --output-junit ctest-junit.xml
  python3 tests/skips/check_skips.py --junit build/asan/ctest-junit.xml --preset asan
}

test_tsan() {
  # UCX's memory hooks patch mmap and munmap, which crashes a TSan-instrumented process (its
  # own interceptors are there first); the ucx backend's TCP and shared-memory transports do
  # not need them. UCX's handler of crash signals (SEGV, BUS, ILL, FPE) frees memory inside
  # the signal, which TSan reports and stops at before anything says where the crash was
  # (once, in Failures.KilledRankIsNamedQuicklyAndShmIsClean): without it, TSan's own report
  # of the crash, with its stack, is what a test prints.
  timed "tsan ctest" env UCX_MEM_EVENTS=no UCX_HANDLE_ERRORS=none \
    ctest --preset tsan -j2 -L 'comm|strategies' -LE single_thread --output-on-failure \
    --output-junit ctest-junit.xml
  python3 tests/skips/check_skips.py --junit build/tsan/ctest-junit.xml --preset tsan
}

run_fuzz() {
  timed "fuzz" bash scripts/fuzz.sh "${FUZZ_SECONDS:-10}"
}

# The ASan tests, with the TSan build beside them when a later step builds it (Note [A build
# beside the tests]). The build outlasts the tests on 2 cores, so a later fuzz step (the ASan
# build's harnesses, one process at a time) runs before the build is waited for, in its shadow.
test_asan_with_tsan_build_beside() {
  if [ "$tsan_built" = 1 ] || [[ " ${steps[*]:$1} " != *" tsan "* ]]; then
    test_asan
    return
  fi
  beside bash scripts/sanitize.sh build-tsan
  test_asan
  if [[ " ${steps[*]:$1} " == *" fuzz "* ]]; then
    run_fuzz
    fuzzed=1
  fi
  wait_beside
  tsan_built=1
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(asan tsan fuzz)
trap stop_beside EXIT
tsan_built=0 fuzzed=0
for i in "${!steps[@]}"; do
  case "${steps[$i]}" in
    build-asan) build_asan ;;
    test-asan) test_asan_with_tsan_build_beside "$i" ;;
    asan) build_asan; test_asan_with_tsan_build_beside "$i" ;;
    build-tsan) build_tsan; tsan_built=1 ;;
    test-tsan) test_tsan ;;
    tsan) [ "$tsan_built" = 1 ] || build_tsan; test_tsan ;;
    fuzz) [ "$fuzzed" = 1 ] || run_fuzz ;;
    *) echo "usage: $0 [asan|tsan|fuzz|build-asan|test-asan|build-tsan|test-tsan ...]" >&2; exit 2 ;;
  esac
done
