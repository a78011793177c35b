#!/usr/bin/env bash
# The sanitizer runs (CI runs this after scripts/test.sh; docs/reliability.md):
#   1. the whole test suite built with AddressSanitizer + UndefinedBehaviorSanitizer
#      (preset asan: -O1 -g, CUDA off; any UBSan report aborts the test);
#   2. the comm, launcher and strategy tests (ctest labels "comm" and "strategies") built with
#      ThreadSanitizer (preset tsan);
#   3. every libFuzzer harness (built in step 1's tree) for FUZZ_SECONDS (default 10) each
#      (scripts/fuzz.sh).
# Each step prints how long it took, and each ctest run's skips are judged against the skip
# ledger (tests/skips/check_skips.py). Needs scripts/install-deps.sh's packages.
#   scripts/sanitize.sh [asan|tsan|fuzz ...]     (default: all three)
set -euo pipefail
cd "$(dirname "$0")/.."

# Reports go to stderr, where ctest keeps them with the failing test's output. UBSan stops at
# its first report (halt_on_error), as ASan always does; TSan's exit code is its own (66).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}

source scripts/timed.sh

run_asan() {
  timed "asan configure+build" bash -c 'cmake --preset asan > /dev/null && cmake --build --preset asan'
  timed "asan ctest" ctest --preset asan -j2 --output-on-failure --output-junit ctest-junit.xml
  python3 tests/skips/check_skips.py --junit build/asan/ctest-junit.xml --preset asan
}

run_tsan() {
  timed "tsan configure+build" bash -c 'cmake --preset tsan > /dev/null &&
    cmake --build --preset tsan --target loom_comm_tests loom_strategy_tests'
  # UCX's memory hooks patch mmap and munmap, which crashes a TSan-instrumented process (its
  # own interceptors are there first); the ucx backend's TCP and shared-memory transports do
  # not need them. UCX's handler of crash signals (SEGV, BUS, ILL, FPE) frees memory inside
  # the signal, which TSan reports and stops at before anything says where the crash was
  # (once, in Failures.KilledRankIsNamedQuicklyAndShmIsClean): without it, TSan's own report
  # of the crash, with its stack, is what a test prints.
  timed "tsan ctest" env UCX_MEM_EVENTS=no UCX_HANDLE_ERRORS=none \
    ctest --preset tsan -j2 -L 'comm|strategies' --output-on-failure --output-junit ctest-junit.xml
  python3 tests/skips/check_skips.py --junit build/tsan/ctest-junit.xml --preset tsan
}

run_fuzz() {
  timed "fuzz" bash scripts/fuzz.sh "${FUZZ_SECONDS:-10}"
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(asan tsan fuzz)
for step in "${steps[@]}"; do
  case "$step" in
    asan) run_asan ;;
    tsan) run_tsan ;;
    fuzz) run_fuzz ;;
    *) echo "usage: $0 [asan|tsan|fuzz ...]" >&2; exit 2 ;;
  esac
done
