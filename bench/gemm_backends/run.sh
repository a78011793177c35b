#!/usr/bin/env bash
# Builds bench/gemm_backends/gemm_backends.cpp once per candidate (Eigen, oneDNN, OpenBLAS,
# BLIS; docs/performance.md, "Matrix products") and runs them interleaved, ROUNDS rounds,
# one thread each. Needs libeigen3-dev libdnnl-dev libopenblas-dev libblis-dev (the last two
# only here: Loom itself uses oneDNN). Not for CI.
#
#   bash bench/gemm_backends/run.sh [OUTDIR]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${1:-$HERE/../../build/bench-gemm-backends}
ROUNDS=${ROUNDS:-2}
LIB=/usr/lib/x86_64-linux-gnu
for f in /usr/include/eigen3/Eigen/Core /usr/include/dnnl.h $LIB/libopenblas.so $LIB/libblis.so; do
  [ -e "$f" ] || { echo "missing $f: apt-get install libeigen3-dev libdnnl-dev libopenblas-dev libblis-dev" >&2; exit 1; }
done
mkdir -p "$OUT"
CXX=(g++ -std=c++20 -O3 -march=native "$HERE/gemm_backends.cpp")
"${CXX[@]}" -DUSE_EIGEN -I/usr/include/eigen3 -Wno-maybe-uninitialized -o "$OUT/eigen"
"${CXX[@]}" -DUSE_DNNL -ldnnl -o "$OUT/onednn"
"${CXX[@]}" "$LIB/libopenblas.so" -o "$OUT/openblas"
"${CXX[@]}" "$LIB/libblis.so" -o "$OUT/blis"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 BLIS_NUM_THREADS=1
{ date -Iseconds; lscpu | grep 'Model name'; } > "$OUT/machine.txt"
for round in $(seq 1 "$ROUNDS"); do
  for candidate in eigen onednn openblas blis; do
    "$OUT/$candidate" > "$OUT/${candidate}_r$round.txt"
    echo "round $round $candidate: $(tail -1 "$OUT/${candidate}_r$round.txt")"
  done
done
