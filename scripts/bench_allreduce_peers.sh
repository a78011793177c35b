#!/usr/bin/env bash
# Allreduce, 2 ranks on this host: Loom (loom-perf --np 2) vs Open MPI vs Gloo, interleaved,
# repeated (the host's core placement drifts), JSON per run into OUT (default
# /tmp/loom_allreduce_peers), then the summary table of docs/performance_comm.md.
# Needs a build with the Open MPI peer (openmpi-bin, libopenmpi-dev); the Gloo peer
# (libgloo-dev) is optional: where it was not built, its row is skipped with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build/release}
OUT=${OUT:-/tmp/loom_allreduce_peers}
REPEATS=${REPEATS:-3}
mkdir -p "$OUT"
mpi() { mpirun --oversubscribe --allow-run-as-root -np 2 "$B/bench/peers/mpi_allreduce_perf" "$@"; }
GLOO=$B/bench/peers/gloo_allreduce_perf
if [ ! -x "$GLOO" ]; then
  echo "skipping Gloo: $GLOO is not built (apt-get install -y libgloo-dev, then configure and build again)" >&2
fi
rm -f "$OUT"/gloo_*.json "$OUT"/lat_gloo_*.json # a stale run's files would pass for this one's
gloo() { if [ -x "$GLOO" ]; then "$GLOO" "$@"; fi; }
for rep in $(seq 1 "$REPEATS"); do
  "$B/tools/loom_perf/loom-perf" allreduce --np 2 -b 8 -e 256M --json "$OUT/loom_$rep.json" >/dev/null
  mpi -b 8 -e 256M --json "$OUT/mpi_$rep.json" >/dev/null
  gloo --np 2 -b 8 -e 256M --json "$OUT/gloo_$rep.json" >/dev/null
  "$B/tools/loom_perf/loom-perf" allreduce --np 2 -b 8 -e 8 -n 20000 -w 2000 --json "$OUT/lat_loom_$rep.json" >/dev/null
  "$B/tools/loom_perf/loom-perf" allreduce --np 2 -b 8 -e 8 -n 20000 -w 2000 -z 1 --json "$OUT/lat_loomz1_$rep.json" >/dev/null
  mpi -b 8 -e 8 -n 20000 -w 2000 --json "$OUT/lat_mpi_$rep.json" >/dev/null
  gloo --np 2 -b 8 -e 8 -n 1000 -w 100 --json "$OUT/lat_gloo_$rep.json" >/dev/null
done
python3 scripts/summarize_allreduce.py "$OUT" "$REPEATS"
