#!/usr/bin/env bash
# The GPU checks of scripts/gpu-check.sh on programs built here, so that a GPU machine's time
# goes to running them rather than to building (docs/cuda.md, "Verification on a GPU").
#
#   bash scripts/gpu-prebuilt.sh pack [BUILD_DIR]     # on Debian, after building BUILD_DIR
#                                                     # (default build/release, CUDA on)
#   bash scripts/gpu-prebuilt.sh run [STAGE...]       # on the GPU machine, from the repo root
#
# pack copies the CUDA test programs, train_gpt and the kernel labs into gpu_prebuilt/bin, and
# the shared libraries they need that a GPU image does not have (Debian's hwloc, UCX, oneDNN,
# ...) into gpu_prebuilt/lib, and packs both into gpu_prebuilt.tar.xz (git-ignored, about 30 MB:
# carry it; run unpacks it). Left out on purpose: glibc,
# libstdc++ and libgcc (a newer system has newer, compatible ones) and the CUDA libraries
# (cuBLAS(Lt), NCCL, the runtime), which must come from the GPU machine's own CUDA 13: run
# looks for them in its CUDA toolkit and in Python's nvidia-* wheels.
#
# run's stages (all by default, in this order): env, tests (each CUDA test program, whole),
# train_gpt (GPT-2 small, bf16-mixed, batch 8, 20 steps), train_gpt_graph (the same with
# --cuda-graph: the whole step one CUDA graph from the second step), train_gpt_v2 (train_gpt with
# the v2 attention kernels, LOOM_CUDA_ATTENTION=v2), torch_eager (the same model in
# PyTorch, scripts/torch_gpt2_bench.py), parity (train_gpt and PyTorch eager, 50 steps from the
# same weights and tokens, losses within 2% at every step: scripts/gpu_loss_parity.py), labs
# (each kernel lab); on request: lab_NAME (one lab), sharded (ZeRO-2 and ZeRO-3 with CPU offload,
# FSDP with CPU offload and plain ZeRO-3 on GPT-2 small, 2 processes sharing the GPU over the
# staged shm backend, 10 steps each),
# torch_compile (torch_eager with torch.compile), phases (train_gpt with synchronous launches
# and --trace, for the time of forward, backward and optimizer), kernels (Nsight Compute's
# GPU time of every kernel of train_gpt's first two steps, as CSV), test_NAME (one CUDA test
# program), llama (train_gpt's Llama at SmolLM-135M's shape, bf16-mixed, batch 4 x 1024). Every stage runs under its
# own time limit within a budget for the whole run (GPU_CHECK_BUDGET_S, default 540 s). The
# output goes to the terminal and to one log, $OUT/gpu-prebuilt-<date>.log when $OUT is set
# (the device tool's output folder, which returns few files), else ./gpu-prebuilt.log.
set -u
set -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
PACK=$ROOT/gpu_prebuilt
TEST_PROGRAMS="test_cuda_runtime test_cuda_ops test_cuda_graph test_nccl test_cuda_collectives test_caching_allocator"

# Libraries a GPU machine provides itself (see the header): never copied.
system_or_cuda() {
  case $(basename "$1") in
    linux-vdso* | ld-linux* | libc.so* | libm.so* | libpthread* | libdl.so* | librt.so* | \
      libstdc++* | libgcc_s* | libcuda.so* | libnvidia* | libcudart* | libcublas* | libnccl* | \
      libnvJitLink* | libnvrtc*) return 0 ;;
  esac
  return 1
}

pack() {
  local build=${1:-build/release} exe name lib
  [ -f "$build/CMakeCache.txt" ] || { echo "gpu-prebuilt: $build is not a build folder"; return 1; }
  grep -q '^LOOM_WITH_CUDA:BOOL=ON' "$build/CMakeCache.txt" ||
    { echo "gpu-prebuilt: $build was configured without CUDA (LOOM_WITH_CUDA is not ON)"; return 1; }
  rm -rf "$PACK" && mkdir -p "$PACK/bin" "$PACK/lib"
  local wanted
  read -ra wanted <<<"$TEST_PROGRAMS train_gpt"
  mapfile -t -O ${#wanted[@]} wanted < <(find "$build/bench/cuda" -maxdepth 1 -type f -name 'lab_*' -perm -u+x -printf '%f\n' | sort)
  for name in "${wanted[@]}"; do
    exe=$(find "$build" -path '*/CMakeFiles' -prune -o -type f -name "$name" -perm -u+x -print | head -1)
    [ -n "$exe" ] || { echo "gpu-prebuilt: $name was not built in $build"; return 1; }
    cp "$exe" "$PACK/bin/" && strip --strip-debug "$PACK/bin/$name"
  done
  local cuda_sonames=()
  for exe in "$PACK"/bin/*; do
    while read -r lib; do
      [ -f "$lib" ] || continue
      if system_or_cuda "$lib"; then
        case $(basename "$lib") in libcublas* | libnccl* | libcudart* | libnvJitLink* | libnvrtc*)
          cuda_sonames+=("$(basename "$lib")") ;; esac
        continue
      fi
      [ -f "$PACK/lib/$(basename "$lib")" ] || cp -L "$lib" "$PACK/lib/"
    done < <(ldd "$exe" | awk '/=> \// {print $3}')
  done
  # cuBLASLt is loaded on first use, not linked (docs/cuda.md): ldd does not list it, the
  # programs name its soname.
  mapfile -t -O ${#cuda_sonames[@]} cuda_sonames < <(grep -aoh 'libcublasLt\.so\.[0-9]*' "$PACK"/bin/* | sort -u)
  {
    echo "packed $(date -Is) on $(hostname) from $(git rev-parse --short HEAD) ($(git status --porcelain | wc -l) changed file(s)), $build"
    echo "cuda-sonames: $(printf '%s\n' "${cuda_sonames[@]}" | sort -u | tr '\n' ' ')"
  } >"$PACK/MANIFEST.txt"
  cat "$PACK/MANIFEST.txt"
  tar -C "$ROOT" -cf - gpu_prebuilt | xz -T0 -6 >"$PACK.tar.xz" || return 1
  du -sh "$PACK/bin" "$PACK/lib" "$PACK.tar.xz"
}

# --------------------------------------------------------------------------------------------
# run

# The folders holding SONAME on this machine: the CUDA toolkit's, then Python's wheels.
find_cuda_lib() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib \
    /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/$1" ] && { echo "$d"; return 0; }
  done
  python3 - "$1" <<'EOF'
import glob, os, site, sys
for sp in site.getsitepackages():
    for hit in glob.glob(os.path.join(sp, "nvidia", "**", sys.argv[1]), recursive=True):
        print(os.path.dirname(hit)); raise SystemExit(0)
raise SystemExit(1)
EOF
}

run_all() {
  if [ -z "${GPU_PREBUILT_LOG:-}" ]; then  # once more under tee, so that the log holds all
    if [ -n "${OUT:-}" ]; then GPU_PREBUILT_LOG=$OUT/gpu-prebuilt-$(date +%Y%m%d-%H%M%S).log; else
      GPU_PREBUILT_LOG=$ROOT/gpu-prebuilt.log; fi
    export GPU_PREBUILT_LOG
    bash "$ROOT/scripts/gpu-prebuilt.sh" run "$@" 2>&1 | tee "$GPU_PREBUILT_LOG"
    return "${PIPESTATUS[0]}"
  fi
  local budget=${GPU_CHECK_BUDGET_S:-540} start=$SECONDS
  if [ ! -f "$PACK/MANIFEST.txt" ] && [ -f "$PACK.tar.xz" ]; then tar -C "$ROOT" -xJf "$PACK.tar.xz" || return 1; fi
  [ -f "$PACK/MANIFEST.txt" ] ||
    { echo "gpu-prebuilt: no $PACK.tar.xz (run 'pack' on Debian and carry it)"; return 1; }
  local stages=("$@")
  [ ${#stages[@]} -gt 0 ] || stages=(env tests train_gpt train_gpt_graph torch_eager parity labs)
  local libpath=$PACK/lib soname dir
  # shellcheck disable=SC2013  # sonames: words, never spaces
  for soname in $(sed -n 's/^cuda-sonames: //p' "$PACK/MANIFEST.txt"); do
    if dir=$(find_cuda_lib "$soname"); then libpath="$libpath:$dir"; else echo "gpu-prebuilt: $soname NOT FOUND"; fi
  done
  export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local summary=() failed=0
  stage() {  # stage NAME CAP_S COMMAND...
    local name=$1 cap=$2 left rc t0=$SECONDS
    shift 2
    left=$((budget - (SECONDS - start) - 10))
    if ((left < 20)); then summary+=("$name SKIP (budget)"); failed=1; return; fi
    ((cap > left)) && cap=$left
    printf '\n========== %s (limit %ss) ==========\n' "$name" "$cap"
    timeout --kill-after=5 "$cap" "$@" 2>&1
    rc=$?
    summary+=("$(printf '%-24s rc=%-4s %4ss' "$name" "$rc" $((SECONDS - t0)))")
    ((rc == 0)) || failed=1
  }
  local s exe strategy
  for s in "${stages[@]}"; do
    case $s in
      env)
        # shellcheck disable=SC2016  # expanded by the inner bash
        stage env 60 bash -c 'cat "$0"/MANIFEST.txt; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; nvidia-smi;
          nvcc --version | tail -2; for e in "$0"/bin/*; do ldd "$e" | grep "not found" | sed "s|^|$(basename "$e"): |"; done;
          python3 -c "import torch; print(\"torch\", torch.__version__, torch.cuda.get_device_name(0))"' "$PACK" ;;
      tests)
        for exe in $TEST_PROGRAMS; do stage "$exe" 120 "$PACK/bin/$exe" --gtest_color=no; done ;;
      labs)
        for exe in "$PACK"/bin/lab_*; do stage "$(basename "$exe")" 120 "$exe"; done ;;
      train_gpt | train_gpt_graph | train_gpt_v2)
        local graph=() attention=v3
        [ "$s" = train_gpt_graph ] && graph=(--cuda-graph)
        [ "$s" = train_gpt_v2 ] && attention=v2
        stage "$s" 200 env LOOM_CUDA_ATTENTION=$attention "$PACK/bin/train_gpt" --device cuda \
          --preset gpt2-small --precision bf16-mixed --batch 8 --steps 20 --log-interval 5 "${graph[@]}" ;;
      llama)
        stage llama 200 "$PACK/bin/train_gpt" --device cuda --model llama --preset smollm-135m \
          --precision bf16-mixed --batch 4 --ctx 1024 --steps 12 --log-interval 4 ;;
      torch_eager | torch_compile)
        local compile=()
        [ "$s" = torch_compile ] && compile=(--compile)
        stage "$s" 240 python3 scripts/torch_gpt2_bench.py --device cuda --layers 12 --heads 12 --embd 768 \
          --ctx 1024 --vocab 50304 --precision bf16-mixed --batch 8 --steps 20 --warmup 2 --log-interval 5 \
          "${compile[@]}" ;;
      sharded)
        for strategy in deepspeed_stage_2_offload deepspeed_stage_3_offload fsdp_cpu_offload deepspeed_stage_3; do
          stage "sharded_$strategy" 150 "$PACK/bin/train_gpt" --device cuda --preset gpt2-small \
            --precision bf16-mixed --batch 4 --steps 10 --log-interval 5 --strategy "$strategy" --devices 2 \
            --process-group-backend shm
        done ;;
      parity)
        stage parity 240 python3 scripts/gpu_loss_parity.py --train-gpt "$PACK/bin/train_gpt" \
          --device cuda --steps 50 ;;
      phases)  # forward, backward and optimizer times: synchronous launches, trace next to the log
        stage phases 120 env CUDA_LAUNCH_BLOCKING=1 "$PACK/bin/train_gpt" --device cuda --preset gpt2-small \
          --precision bf16-mixed --batch 8 --steps 6 --log-interval 1 --trace "${GPU_PREBUILT_LOG%.log}.trace.json" ;;
      kernels)  # the GPU time of every kernel of train_gpt's first 2 steps, Nsight Compute's CSV
        # shellcheck disable=SC2016  # expanded by the inner bash
        stage kernels 150 bash -c 'ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
          [ -n "$ncu" ] || { echo "no ncu on this machine"; exit 1; }
          "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$0" \
            "$1" --device cuda --preset gpt2-small --precision bf16-mixed --batch 8 --steps 2 &&
          echo "$(wc -l <"$0") lines in $0"' "${GPU_PREBUILT_LOG%.log}.kernels.csv" "$PACK/bin/train_gpt" ;;
      lab_*) stage "$s" 120 "$PACK/bin/$s" ;;
      test_*) stage "$s" 120 "$PACK/bin/$s" --gtest_color=no ;;
      *) echo "gpu-prebuilt: unknown stage '$s' (env tests train_gpt train_gpt_graph train_gpt_v2 torch_eager parity labs torch_compile sharded phases kernels lab_NAME test_NAME llama)"; return 2 ;;
    esac
  done
  printf '\n========== summary (%ss of %ss) ==========\n' $((SECONDS - start)) "$budget"
  printf '%s\n' "${summary[@]}"
  return "$failed"
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  run) shift; run_all "$@" ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
