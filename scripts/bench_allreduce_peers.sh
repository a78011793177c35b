#!/usr/bin/env bash
# Allreduce, 2 ranks on this host: Loom (loom-perf --np 2) vs Open MPI vs Gloo, interleaved,
# repeated (the host's core placement drifts), JSON per run into OUT (default
# /tmp/loom_allreduce_peers), then the summary table of docs/performance_comm.md.
# Needs a build with the peers (openmpi-bin, libopenmpi-dev, libgloo-dev installed).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build/release}
OUT=${OUT:-/tmp/loom_allreduce_peers}
REPEATS=${REPEATS:-3}
mkdir -p "$OUT"
mpi() { mpirun --oversubscribe --allow-run-as-root -np 2 "$B/bench/peers/mpi_allreduce_perf" "$@"; }
for rep in $(seq 1 "$REPEATS"); do
  "$B/tools/loom_perf/loom-perf" allreduce --np 2 -b 8 -e 256M --json "$OUT/loom_$rep.json" >/dev/null
  mpi -b 8 -e 256M --json "$OUT/mpi_$rep.json" >/dev/null
  "$B/bench/peers/gloo_allreduce_perf" --np 2 -b 8 -e 256M --json "$OUT/gloo_$rep.json" >/dev/null
  "$B/tools/loom_perf/loom-perf" allreduce --np 2 -b 8 -e 8 -n 20000 -w 2000 --json "$OUT/lat_loom_$rep.json" >/dev/null
  "$B/tools/loom_perf/loom-perf" allreduce --np 2 -b 8 -e 8 -n 20000 -w 2000 -z 1 --json "$OUT/lat_loomz1_$rep.json" >/dev/null
  mpi -b 8 -e 8 -n 20000 -w 2000 --json "$OUT/lat_mpi_$rep.json" >/dev/null
  "$B/bench/peers/gloo_allreduce_perf" --np 2 -b 8 -e 8 -n 1000 -w 100 --json "$OUT/lat_gloo_$rep.json" >/dev/null
done
python3 scripts/summarize_allreduce.py "$OUT" "$REPEATS"
