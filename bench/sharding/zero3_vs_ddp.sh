#!/usr/bin/env bash
# The issue-9 goal "ZeRO-3 / FULL_SHARD step within 1.10x Loom's own DDP step", measured
# interleaved (ddp, deepspeed_stage_3, fsdp with Block units, repeated ROUNDS times) on the
# model of vs_peers.sh; prints each run's median step time and the ratios of the medians.
#   bash bench/sharding/zero3_vs_ddp.sh [ROUNDS]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PERF=$ROOT/build/release/tools/loom_perf/loom-perf
ROUNDS=${1:-5}
MODEL=(--layers 8 --heads 8 --embd 512 --ctx 64 --batch 4 --steps 12 --warmup 3 --np 2)
declare -A times
for round in $(seq 1 "$ROUNDS"); do
  for config in "ddp" "deepspeed_stage_3" "fsdp --wrap-policy Block"; do
    # shellcheck disable=SC2086
    ms=$("$PERF" strategy --strategy $config "${MODEL[@]}" | sed -n 's/.*step time (slowest rank): median \([0-9.]*\) ms.*/\1/p')
    times[$config]+="$ms "
    echo "round $round: $config $ms ms"
  done
done
python3 - "${times[ddp]}" "${times[deepspeed_stage_3]}" "${times[fsdp --wrap-policy Block]}" <<'PY'
import statistics, sys
ddp, z3, fsdp = ([float(x) for x in a.split()] for a in sys.argv[1:4])
m = statistics.median
print(f"medians: ddp {m(ddp):.0f} ms, deepspeed_stage_3 {m(z3):.0f} ms, fsdp Block {m(fsdp):.0f} ms")
print(f"deepspeed_stage_3 / ddp = {m(z3) / m(ddp):.3f}; fsdp / ddp = {m(fsdp) / m(ddp):.3f}")
PY
