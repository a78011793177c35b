#!/usr/bin/env bash
# What two processes computing at once cost each other on this host's cores: a pipeline's
# two stages do that whenever both have a micro-batch (docs/parallelism.md). For Loom
# (loom_bench's BM_Matmul, oneDNN's sgemm behind matmul) and PyTorch (torch.mm, MKL) at the
# MLP products of a 1024-wide stage's micro-batch (256 x 1024 x 4096: 2 rows of ctx 128, as
# vs_peers.sh ran at 25M) and of GPT-2 small (1024 x 768 x 3072), one thread each: the GEMM
# rate alone, then with a second process running the same product on the other core
# (taskset), interleaved for ROUNDS rounds. Prints the rates and together / alone. Not for CI: it needs the peers' venv
# (bench/peers/python/setup.sh) and both cores idle.
#
#   bash bench/parallelism/contention.sh [OUTDIR]
# Environment: ROUNDS (3), PEERS_VENV.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/build/bench-contention}
ROUNDS=${ROUNDS:-3}
V=${PEERS_VENV:-/tmp/peers-venv}
B=$ROOT/build/release/bench/loom_bench
[ -x "$V/bin/python" ] || { echo "no peers venv at $V: run bash $ROOT/bench/peers/python/setup.sh" >&2; exit 1; }
[ -x "$B" ] || { echo "build Loom first (cmake --build --preset release)" >&2; exit 1; }
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

# GFLOP/s of one program at M x K x N on CPU $4, written to $5.
loom() {
  taskset -c "$4" "$B" --benchmark_filter="BM_Matmul/M:$1/K:$2/N:$3/layout:0\$" \
    --benchmark_min_time=3 --benchmark_out="$5.json" --benchmark_out_format=json > /dev/null 2>&1
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["benchmarks"][0]["GFLOP/s"])' \
    "$5.json" > "$5"
}
torch_mm() {
  taskset -c "$4" "$V/bin/python" - "$1" "$2" "$3" > "$5" <<'PY'
import sys, time, torch
torch.set_num_threads(1)
m, k, n = map(int, sys.argv[1:4])
a, b = torch.randn(m, k), torch.randn(k, n)
for _ in range(3):
    torch.mm(a, b)
count, start = 0, time.perf_counter()
while time.perf_counter() - start < 3:
    torch.mm(a, b)
    count += 1
print(2 * m * k * n * count / (time.perf_counter() - start) / 1e9)
PY
}

for shape in "256 1024 4096" "1024 768 3072"; do
  read -r m k n <<< "$shape"
  for round in $(seq 1 "$ROUNDS"); do
    for prog in loom torch_mm; do
      "$prog" "$m" "$k" "$n" 0 "$OUT/${prog}_${m}x${k}x${n}_alone_r$round"
      "$prog" "$m" "$k" "$n" 0 "$OUT/${prog}_${m}x${k}x${n}_together_r$round" &
      "$prog" "$m" "$k" "$n" 1 "$OUT/${prog}_${m}x${k}x${n}_other_r$round"
      wait
    done
  done
done
{ date -Iseconds; lscpu | grep 'Model name'; git -C "$ROOT" rev-parse --short HEAD; } > "$OUT/machine.txt"

python3 - "$OUT" "$ROUNDS" <<'PY'
import statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
read = lambda name: float(open(f"{out}/{name}").read())
print("| program | M x K x N | alone GFLOP/s | two at once, each | together / alone |")
print("|---|---|---:|---:|---:|")
for shape in ("256x1024x4096", "1024x768x3072"):
    for prog, label in (("loom", "Loom (oneDNN)"), ("torch_mm", "PyTorch (MKL)")):
        alone = statistics.median(read(f"{prog}_{shape}_alone_r{r}") for r in range(1, rounds + 1))
        both = statistics.median(
            (read(f"{prog}_{shape}_together_r{r}") + read(f"{prog}_{shape}_other_r{r}")) / 2
            for r in range(1, rounds + 1))
        print(f"| {label} | {shape.replace('x', ' x ')} | {alone:.1f} | {both:.1f} | "
              f"{both / alone:.2f} |")
PY
