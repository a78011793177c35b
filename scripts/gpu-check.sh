#!/usr/bin/env bash
# The by-hand GPU verification (docs/cuda.md, "Verification on a GPU"). Run from the
# repository root on a machine with an NVIDIA GPU, nvcc, CMake and PyTorch (the device tool's
# H100/H200 image), after scripts/carry-third-party.sh has made ./third_party_carry on a
# Debian machine (that image has no Debian packages: GoogleTest, Google Benchmark, Eigen,
# nlohmann_json, CLI11 and hwloc come from there).
#
#   bash scripts/gpu-check.sh                 # every stage, in order
#   bash scripts/gpu-check.sh ctest labs      # only these stages, in the order below
#
# Stages, in order:
#   env            nvidia-smi, nvcc, cmake, ninja, the host compiler, glibc, torch + the GPU's name
#   nccl           find NCCL: the CUDA toolkit's, else the PyTorch wheel's nvidia/nccl folder
#                  (passed to CMake as -DNCCL_ROOT); none found -> LOOM_WITH_NCCL is off
#   gtest          build GoogleTest/GoogleMock from third_party_carry/googletest-src and install
#                  them into $GTEST_PREFIX (default /tmp/loom-gtest-install, outside the tree:
#                  the device tool replaces a carried folder on every call, which would delete an
#                  install inside it; skipped when already there)
#   configure      Release build with CUDA in $BUILD_DIR (default build/gpu), the carried
#                  packages passed as <Package>_DIR and CMAKE_PREFIX_PATH
#   build          the CUDA test programs, train_gpt and the kernel labs (keeps going on errors)
#   ctest          the tests of test_cuda_ops test_cuda_runtime test_cuda_graph
#                  test_caching_allocator test_nccl test_cuda_collectives (ctest -R,
#                  --output-on-failure)
#   labs           every build/gpu/bench/cuda/lab_* (one summary row per lab)
#   train_gpt      train_gpt --device cuda --preset gpt2-small --precision bf16-mixed --batch 8
#                  --steps 20
#   torch_eager    scripts/torch_gpt2_bench.py, same config
#   torch_compile  the same with --compile
#   build_all      everything else in the project (checks the whole tree builds with CUDA on)
#
# Every stage runs even when an earlier one failed, under a time limit of its own and within
# a budget for the whole script (GPU_CHECK_BUDGET_S, default 570 s: the device tool stops a
# command at 600 s); a stage that does not fit is reported SKIP, with the command that runs it
# again. The end is a summary table and the benchmark lines side by side. Exit status 0 when
# every stage ran and passed.
#
# Output goes to the terminal and to $OUT/gpu-check-<date>.log when $OUT is set (the device
# tool's output folder), else to ./gpu-check.log.
#
# Environment: BUILD_DIR (build/gpu), PYTHON (python3), JOBS (nproc), CUDA_ARCH (CMake's
# CMAKE_CUDA_ARCHITECTURES; default: the project's, 90), NCCL_ROOT (skip the search),
# CTEST_JOBS (1: the tests share one GPU), BENCH_BATCH (8), BENCH_STEPS (20),
# BENCH_PRECISION (bf16-mixed), GPU_CHECK_BUDGET_S (570), GTEST_PREFIX (/tmp/loom-gtest-install),
# CUDA_TEST_PROGRAMS (the six above).

set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1

ALL_STAGES=(env nccl gtest configure build ctest labs train_gpt torch_eager torch_compile build_all)
if [ $# -gt 0 ]; then STAGES=("$@"); else STAGES=("${ALL_STAGES[@]}"); fi
for s in "${STAGES[@]}"; do
  case " ${ALL_STAGES[*]} " in
    *" $s "*) ;;
    *) echo "gpu-check: unknown stage '$s'; stages: ${ALL_STAGES[*]}"; exit 2 ;;
  esac
done

# Everything below runs once more under tee, so that the log holds all of it.
if [ -z "${GPU_CHECK_LOG:-}" ]; then
  if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT" || exit 1
    GPU_CHECK_LOG="$OUT/gpu-check-$(date +%Y%m%d-%H%M%S).log"
  else
    GPU_CHECK_LOG="$ROOT/gpu-check.log"
  fi
  export GPU_CHECK_LOG
  bash "$ROOT/scripts/gpu-check.sh" "$@" 2>&1 | tee "$GPU_CHECK_LOG"
  exit "${PIPESTATUS[0]}"
fi

wanted() { case " ${STAGES[*]} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

export BUILD_DIR=${BUILD_DIR:-build/gpu}
export PY=${PYTHON:-python3}
export JOBS=${JOBS:-$(nproc)}
export CTEST_JOBS=${CTEST_JOBS:-1}
export BENCH_BATCH=${BENCH_BATCH:-8}
export BENCH_STEPS=${BENCH_STEPS:-20}
export BENCH_PRECISION=${BENCH_PRECISION:-bf16-mixed}
BUDGET=${GPU_CHECK_BUDGET_S:-570}
export CARRY="$ROOT/third_party_carry"
export CARRY_PREFIX="$CARRY/usr"
export GTEST_PREFIX=${GTEST_PREFIX:-/tmp/loom-gtest-install}
export GTEST_BUILD=/tmp/loom-gtest-build
export STATE=/tmp/loom-gpu-check
export CUDA_TEST_PROGRAMS=${CUDA_TEST_PROGRAMS:-"test_cuda_ops test_cuda_runtime test_cuda_graph test_caching_allocator test_nccl test_cuda_collectives"}
export PYTHONUNBUFFERED=1
rm -rf "$STATE" && mkdir -p "$STATE"

START=$(date +%s)
SUMMARY=()   # "name|RESULT|seconds|note"
FAILED=0

banner() { printf '\n========== %s ==========\n' "$*"; }
record() {  # record NAME RESULT SECONDS NOTE
  SUMMARY+=("$1|$2|$3|$4")
  [ "$2" = PASS ] || FAILED=1
  printf -- '---------- %s: %s (%ss)%s\n' "$1" "$2" "$3" "${4:+, $4}"
}

# run_stage NAME CAP_S COMMAND... : runs COMMAND (a program or an exported function) with its
# output in the log and in $STATE/NAME.log, under min(CAP_S, what is left of the budget).
run_stage() {
  local name=$1 cap=$2
  shift 2
  local left=$((BUDGET - ($(date +%s) - START)))
  if ((left < 30)); then
    local again=${name%%:*}
    [ "$again" = lab ] && again=labs
    record "$name" SKIP 0 "no time left of the ${BUDGET}s budget; rerun: bash scripts/gpu-check.sh $again"
    return 1
  fi
  local limit=$((cap < left - 15 ? cap : left - 15))
  banner "$name (limit ${limit}s, $(date +%H:%M:%S))"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" bash -c '"$@"' _ "$@" 2>&1 | tee "$STATE/$name.log"
  local rc=${PIPESTATUS[0]}
  local dt=$((SECONDS - t0))
  local note=""  # a stage may leave a line for the summary in $STATE/NAME.note
  [ -f "$STATE/$name.note" ] && note=$(head -1 "$STATE/$name.note")
  if ((rc == 0)); then
    record "$name" PASS "$dt" "$note"
  elif ((rc == 124 || rc == 137)); then
    record "$name" TIMEOUT "$dt" "stopped after ${limit}s${note:+; $note}"
  else
    record "$name" FAIL "$dt" "exit status $rc${note:+; $note}"
  fi
  return "$rc"
}

# ---------------------------------------------------------------------------------------------
# Tools: nvcc (PATH, then the usual CUDA folders), the generator, pkg-config.

NVCC=$(command -v nvcc || true)
for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /opt/cuda; do
  [ -n "$NVCC" ] && break
  [ -n "$d" ] && [ -x "$d/bin/nvcc" ] && NVCC="$d/bin/nvcc"
done
if [ -n "$NVCC" ]; then
  export CUDA_HOME=${CUDA_HOME:-$(cd "$(dirname "$NVCC")/.." && pwd)}
  PATH="$(dirname "$NVCC"):$PATH"
  export PATH
fi
export NVCC
if command -v ninja >/dev/null; then export GENERATOR=Ninja KEEP_GOING="-k 0"; else
  export GENERATOR="Unix Makefiles" KEEP_GOING="-k"; fi

# hwloc (tools/loomrun needs it through pkg-config): the machine's own if it has one, else the
# carried copy; pkg-config itself likewise.
PKG_CONFIG_EXE=$(command -v pkg-config || true)
HWLOC_FROM=system
if [ -z "$PKG_CONFIG_EXE" ] || ! "$PKG_CONFIG_EXE" --exists hwloc 2>/dev/null; then
  HWLOC_FROM=carried
  [ -n "$PKG_CONFIG_EXE" ] || PKG_CONFIG_EXE="$CARRY/fallback/bin/pkg-config"
  export PKG_CONFIG_PATH="$CARRY_PREFIX/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  # libhwloc.so needs libudev.so.1; the linker and the loader both read LD_LIBRARY_PATH.
  if ! ldconfig -p 2>/dev/null | grep -q 'libudev\.so\.1 '; then
    export LD_LIBRARY_PATH="$CARRY/fallback/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi
export PKG_CONFIG_EXE HWLOC_FROM

# ---------------------------------------------------------------------------------------------
# Stage bodies (exported: run_stage runs them in a child bash under timeout).
# shellcheck disable=SC2317  # reached through run_stage

stage_env() {
  local rc=0
  echo "date: $(date -Is)   host: $(hostname)   repo: $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) changed file(s)"
  echo "kernel: $(uname -srm)   cpus: $(nproc)"
  (. /etc/os-release 2>/dev/null && echo "os: $PRETTY_NAME")
  echo "glibc: $(ldd --version 2>&1 | head -1)"
  echo; nvidia-smi || rc=1
  echo; if [ -n "$NVCC" ]; then "$NVCC" --version || rc=1; else echo "nvcc: NOT FOUND"; rc=1; fi
  echo; cmake --version | head -1 || rc=1
  echo "ninja: $(ninja --version 2>/dev/null || echo 'not found (Unix Makefiles)')"
  echo "c++: $(c++ --version 2>&1 | head -1)"
  echo "pkg-config: $PKG_CONFIG_EXE (hwloc: $HWLOC_FROM)"
  echo; "$PY" - <<'EOF' || rc=1
import torch
print("python torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| cuda available:", torch.cuda.is_available())
if not torch.cuda.is_available():
    raise SystemExit("torch sees no CUDA device")
p = torch.cuda.get_device_properties(0)
print("torch.cuda.get_device_name(0):", torch.cuda.get_device_name(0),
      f"| sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.1f} GiB")
try:
    print("torch NCCL", ".".join(map(str, torch.cuda.nccl.version())))
except Exception as e:  # noqa: BLE001
    print("torch NCCL: unknown:", e)
print("torch.compile:", hasattr(torch, "compile"),
      "| scaled_dot_product_attention:", hasattr(torch.nn.functional, "scaled_dot_product_attention"))
EOF
  echo; if [ -f "$CARRY/MANIFEST.txt" ]; then sed -n '1,/^## CMake/p' "$CARRY/MANIFEST.txt" | head -n -1; else
    echo "third_party_carry: MISSING (run scripts/carry-third-party.sh on the Debian machine and carry it)"; rc=1; fi
  return $rc
}

stage_gtest() {
  if [ -f "$GTEST_PREFIX/lib/cmake/GTest/GTestConfig.cmake" ]; then
    echo "GoogleTest already installed in $GTEST_PREFIX"
    return 0
  fi
  [ -f "$CARRY/googletest-src/CMakeLists.txt" ] || {
    echo "no $CARRY/googletest-src: run scripts/carry-third-party.sh and carry third_party_carry"
    return 1
  }
  rm -rf "$GTEST_BUILD"
  cmake -S "$CARRY/googletest-src" -B "$GTEST_BUILD" -G "$GENERATOR" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$GTEST_PREFIX" -DCMAKE_INSTALL_LIBDIR=lib -DBUILD_GMOCK=ON \
    -DINSTALL_GTEST=ON -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_POLICY_VERSION_MINIMUM=3.5 &&
    cmake --build "$GTEST_BUILD" -j "$JOBS" &&
    cmake --install "$GTEST_BUILD" &&
    ls "$GTEST_PREFIX/lib"
}

configure_args() {
  local args=(-S . -B "$BUILD_DIR" -G "$GENERATOR" -DCMAKE_BUILD_TYPE=Release
    -DLOOM_WITH_CUDA=ON -DLOOM_BUILD_TESTS=ON
    -DCMAKE_PREFIX_PATH="$GTEST_PREFIX;$CARRY_PREFIX"
    -DGTest_DIR="$GTEST_PREFIX/lib/cmake/GTest" -DGTEST_ROOT="$GTEST_PREFIX"
    -DEigen3_DIR="$CARRY_PREFIX/share/eigen3/cmake"
    -Dnlohmann_json_DIR="$CARRY_PREFIX/share/cmake/nlohmann_json"
    -DCLI11_DIR="$CARRY_PREFIX/share/cmake/CLI11"
    -Dbenchmark_DIR="$CARRY_PREFIX/lib/x86_64-linux-gnu/cmake/benchmark"
    -DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG_EXE" -DPKG_CONFIG_USE_CMAKE_PREFIX_PATH=OFF
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5)
  [ -n "$NVCC" ] && args+=(-DCMAKE_CUDA_COMPILER="$NVCC")
  [ -n "${CUDA_ARCH:-}" ] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH")
  [ -n "${NCCL_ROOT:-}" ] && args+=(-DNCCL_ROOT="$NCCL_ROOT")
  printf '%s\n' "${args[@]}"
}

stage_configure() {
  local args=() rc
  mapfile -t args < <(configure_args)
  echo "cmake ${args[*]} -DLOOM_BUILD_BENCHMARKS=ON"
  cmake "${args[@]}" -DLOOM_BUILD_BENCHMARKS=ON 2>&1 | tee "$STATE/configure-1.log"
  rc=${PIPESTATUS[0]}
  if ((rc != 0)); then
    if grep -q 'CUDA20' "$STATE/configure-1.log"; then
      echo "gpu-check: this CMake ($(cmake --version | head -1)) does not know nvcc's C++20 flag"
      echo "(Debian 12's 3.25.1 fails so); a newer CMake is needed, e.g. python3 -m pip's cmake"
    fi
    grep -qi 'benchmark' "$STATE/configure-1.log" || return 1
    echo
    echo "gpu-check: configure failed on Google Benchmark; trying LOOM_BUILD_BENCHMARKS=OFF (the"
    echo "carried libbenchmark.so needs glibc >= 2.34 and GLIBCXX_3.4.30; without benchmarks,"
    echo "bench/ and its kernel labs are not built)"
    rm -f "$BUILD_DIR/CMakeCache.txt"
    cmake "${args[@]}" -DLOOM_BUILD_BENCHMARKS=OFF || return 1
    rc=3  # configured, but without the labs: reported as a failure
  fi
  echo
  grep -E '^(LOOM_WITH_CUDA|LOOM_WITH_NCCL|LOOM_BUILD_BENCHMARKS|NCCL_LIBRARY|NCCL_INCLUDE_DIR|CMAKE_CUDA_COMPILER|CMAKE_CUDA_ARCHITECTURES|CMAKE_CXX_COMPILER|GTest_DIR|Eigen3_DIR|benchmark_DIR|pkgcfg_lib_HWLOC_hwloc):' \
    "$BUILD_DIR/CMakeCache.txt"
  grep -q '^LOOM_WITH_CUDA:BOOL=ON' "$BUILD_DIR/CMakeCache.txt" || { echo "LOOM_WITH_CUDA is not ON"; return 1; }
  return "$rc"
}

# The build system's target names (Ninja or Makefiles).
list_targets() {
  if [ "$GENERATOR" = Ninja ]; then
    ninja -C "$BUILD_DIR" -t targets all 2>/dev/null | sed -n 's/^\([A-Za-z0-9_.+-]*\): phony$/\1/p'
  else
    cmake --build "$BUILD_DIR" --target help 2>/dev/null | sed -n 's/^\.\.\. \([A-Za-z0-9_.+-]*\).*/\1/p'
  fi | sort -u
}

stage_build() {
  [ -f "$BUILD_DIR/CMakeCache.txt" ] || { echo "not configured"; return 1; }
  local all targets=() t
  all=$(list_targets)
  for t in $CUDA_TEST_PROGRAMS train_gpt $(grep '^lab_' <<<"$all"); do
    if grep -qx "$t" <<<"$all"; then targets+=("$t"); else echo "gpu-check: no target $t in this build"; fi
  done
  echo "building: ${targets[*]}"
  [ ${#targets[@]} -gt 0 ] || return 1
  # shellcheck disable=SC2086
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}" -- $KEEP_GOING
}

stage_build_all() {
  [ -f "$BUILD_DIR/CMakeCache.txt" ] || { echo "not configured"; return 1; }
  # shellcheck disable=SC2086
  cmake --build "$BUILD_DIR" -j "$JOBS" -- $KEEP_GOING
}

stage_ctest() {
  [ -f "$BUILD_DIR/CTestTestfile.cmake" ] || { echo "not configured"; return 1; }
  # gtest_discover_tests registers one CTest test per test case (Suite.Case), so select by the
  # program each test runs: -R with their names, and -I with their numbers (names can repeat
  # across programs, e.g. a conformance suite instantiated for several backends).
  local sel regex numbers
  if ! ctest --test-dir "$BUILD_DIR" --show-only=json-v1 >"$STATE/ctest.json"; then
    echo "ctest --show-only failed"
    return 1
  fi
  sel=$("$PY" - "$STATE/ctest.json" $CUDA_TEST_PROGRAMS <<'EOF'
import json, os, re, sys
tests = json.load(open(sys.argv[1])).get("tests", [])
programs = sys.argv[2:]
chosen = {p: [] for p in programs}  # program -> [(ctest number, name)]
for number, t in enumerate(tests, start=1):
    cmd = t.get("command") or []
    prog = os.path.basename(cmd[0]) if cmd else ""
    if prog not in chosen and t["name"].endswith("_NOT_BUILT"):
        # gtest_discover_tests' placeholder for a program that was not built: run it, so that
        # ctest reports it as failed.
        prog = t["name"][:-len("_NOT_BUILT")]
    if prog in chosen:
        chosen[prog].append((number, t["name"]))
for p in programs:
    n = chosen[p]
    state = ("NOT BUILT" if [name for _, name in n] == [p + "_NOT_BUILT"] else f"{len(n)} test(s)") \
        if n else "not in this configuration (no such CMake target)"
    print(f"  {p}: {state}", file=sys.stderr)
picked = [x for p in programs for x in chosen[p]]
if picked:
    names = sorted({name for _, name in picked})
    print("^(" + "|".join(re.escape(n) for n in names) + ")$")
    print("0,0,0," + ",".join(str(number) for number, _ in picked))
EOF
  ) || return 1
  regex=$(sed -n 1p <<<"$sel")
  numbers=$(sed -n 2p <<<"$sel")
  [ -n "$regex" ] && [ -n "$numbers" ] || { echo "no CUDA tests registered"; return 1; }
  local rc
  ctest --test-dir "$BUILD_DIR" -R "$regex" -I "$numbers" --output-on-failure --timeout 300 \
    -j "$CTEST_JOBS" 2>&1 | tee "$STATE/ctest.out"
  rc=${PIPESTATUS[0]}
  # On a GPU machine a skipped CUDA test means it did not see the GPU: worth a look.
  local total skipped
  total=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#' "$STATE/ctest.out")
  skipped=$(grep -cE '^ *[0-9]+/[0-9]+ Test +#.*\*\*\*Skipped' "$STATE/ctest.out")
  echo "$total test(s) run, $skipped skipped$( ((skipped > 0)) && echo ' (a skipped CUDA test did not find the GPU)')" \
    >"$STATE/ctest.note"
  return "$rc"
}

stage_one_lab() {
  "$1"
}

# bench_note NAME: the steady-state line's ms/step, tokens/s and MFU, for the summary.
bench_note() {
  sed -n 's/^steady state[^:]*: \([0-9.]* ms\/step\), \([0-9]* tokens\/s\).*\(MFU [0-9.]*%\).*/\1, \2, \3/p' \
    "$STATE/$1.bench" 2>/dev/null | tail -1 >"$STATE/$1.note"
}

stage_train_gpt() {
  local exe="$BUILD_DIR/tools/train_gpt/train_gpt" rc
  [ -x "$exe" ] || { echo "$exe was not built"; return 1; }
  "$exe" --device cuda --preset gpt2-small --precision "$BENCH_PRECISION" --batch "$BENCH_BATCH" \
    --steps "$BENCH_STEPS" --log-interval 5 2>&1 | tee "$STATE/train_gpt.bench"
  rc=${PIPESTATUS[0]}
  bench_note train_gpt
  return "$rc"
}

stage_torch() {  # stage_torch NAME [--compile]
  local name=$1 rc
  shift
  "$PY" scripts/torch_gpt2_bench.py --device cuda --layers 12 --heads 12 --embd 768 --ctx 1024 \
    --vocab 50304 --precision "$BENCH_PRECISION" --batch "$BENCH_BATCH" --steps "$BENCH_STEPS" \
    --warmup 2 --log-interval 5 "$@" 2>&1 | tee "$STATE/$name.bench"
  rc=${PIPESTATUS[0]}
  bench_note "$name"
  return "$rc"
}

export -f stage_env stage_gtest configure_args stage_configure list_targets stage_build \
  stage_build_all stage_ctest stage_one_lab bench_note stage_train_gpt stage_torch

# ---------------------------------------------------------------------------------------------
# NCCL: runs in this shell, not in a child, since configure needs NCCL_ROOT.

find_nccl() {
  local d lib
  for d in "${NCCL_ROOT:-}" "${CUDA_HOME:-}" /usr/local/cuda /usr; do
    [ -n "$d" ] && [ -f "$d/include/nccl.h" ] || continue
    lib=$(ls "$d"/lib64/libnccl.so* "$d"/lib/libnccl.so* "$d"/lib/x86_64-linux-gnu/libnccl.so* 2>/dev/null | head -1)
    [ -n "$lib" ] && { NCCL_FROM="the CUDA toolkit / system ($d)"; NCCL_ROOT=$d; NCCL_LIB=$lib; return 0; }
  done
  # The PyTorch wheel's nvidia/nccl (nvidia-nccl-cu1x): include/nccl.h, lib/libnccl.so.2.
  while IFS= read -r d; do
    [ -f "$d/include/nccl.h" ] || continue
    lib=$(ls "$d"/lib/libnccl.so* "$d"/lib64/libnccl.so* 2>/dev/null | head -1)
    [ -n "$lib" ] && { NCCL_FROM="the PyTorch wheel ($d)"; NCCL_ROOT=$d; NCCL_LIB=$lib; return 0; }
  done < <("$PY" - <<'EOF'
import glob, os, site
found = []
try:
    import nvidia.nccl as m
    found += list(m.__path__)
except Exception:  # noqa: BLE001
    pass
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    for h in glob.glob(os.path.join(sp, "nvidia", "**", "include", "nccl.h"), recursive=True):
        found.append(os.path.dirname(os.path.dirname(h)))
print("\n".join(dict.fromkeys(found)))
EOF
  )
  return 1
}

stage_nccl_here() {
  banner "nccl"
  local t0=$SECONDS version
  NCCL_FROM="" NCCL_LIB=""
  if find_nccl; then
    export NCCL_ROOT
    LD_LIBRARY_PATH="$(dirname "$NCCL_LIB")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LD_LIBRARY_PATH
    version=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH)/ {printf "%s%s", sep, $3; sep="."}' "$NCCL_ROOT/include/nccl.h")
    echo "NCCL $version from $NCCL_FROM: -DNCCL_ROOT=$NCCL_ROOT ($NCCL_LIB)"
    record nccl PASS $((SECONDS - t0)) "NCCL $version, $NCCL_FROM"
  else
    echo "NCCL not found (no nccl.h + libnccl.so in the CUDA toolkit, /usr, or python's nvidia/nccl);"
    echo "configure will turn LOOM_WITH_NCCL off and test_nccl will not exist"
    record nccl FAIL $((SECONDS - t0)) "not found"
  fi
}

# ---------------------------------------------------------------------------------------------
# The stages, in order.

# A configure without the nccl stage still passes NCCL_ROOT.
if ! wanted nccl && wanted configure && [ -z "${NCCL_ROOT:-}" ] && find_nccl; then
  export NCCL_ROOT
fi

for stage in "${STAGES[@]}"; do
  case $stage in
    env) run_stage env 60 stage_env ;;
    nccl) stage_nccl_here ;;
    gtest) run_stage gtest 240 stage_gtest ;;
    configure) run_stage configure 180 stage_configure ;;
    build) run_stage build 420 stage_build ;;
    ctest) run_stage ctest 300 stage_ctest ;;
    labs)
      mapfile -t labs < <(find "$BUILD_DIR/bench/cuda" -maxdepth 1 -type f -name 'lab_*' -perm -u+x 2>/dev/null | sort)
      if [ ${#labs[@]} -eq 0 ]; then
        mapfile -t labs < <(find "$BUILD_DIR" -path '*/CMakeFiles' -prune -o -type f -name 'lab_*' -perm -u+x -print 2>/dev/null | sort)
      fi
      if [ ${#labs[@]} -eq 0 ]; then
        banner labs
        echo "no lab_* programs under $BUILD_DIR"
        record labs FAIL 0 "no lab_* programs built"
      fi
      for lab in "${labs[@]}"; do run_stage "lab:$(basename "$lab")" 150 stage_one_lab "$lab"; done
      ;;
    train_gpt) run_stage train_gpt 240 stage_train_gpt ;;
    torch_eager) run_stage torch_eager 180 stage_torch torch_eager ;;
    torch_compile) run_stage torch_compile 360 stage_torch torch_compile --compile ;;
    build_all) run_stage build_all 420 stage_build_all ;;
  esac
done

# ---------------------------------------------------------------------------------------------
# Summary.

banner "summary ($(($(date +%s) - START))s of a ${BUDGET}s budget)"
printf '%-28s %-8s %6s  %s\n' stage result seconds note
printf '%-28s %-8s %6s  %s\n' ---------------------------- -------- ------ ----
for row in "${SUMMARY[@]}"; do
  IFS='|' read -r name result secs note <<<"$row"
  printf '%-28s %-8s %6s  %s\n' "$name" "$result" "$secs" "$note"
done

if ls "$STATE"/{train_gpt,torch_eager,torch_compile}.log >/dev/null 2>&1; then
  echo
  echo "GPT-2 small, batch $BENCH_BATCH, $BENCH_STEPS steps, $BENCH_PRECISION:"
  for s in train_gpt torch_eager torch_compile; do
    [ -f "$STATE/$s.log" ] || continue
    grep -E '^(steady state|summary:|peak memory)' "$STATE/$s.log" | sed "s/^/  $s: /"
  done
fi
echo
echo "log: $GPU_CHECK_LOG"
exit "$FAILED"
