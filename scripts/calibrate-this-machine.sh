#!/usr/bin/env bash
# Writes sim/clusters/this-machine.json, loom-sim's default cluster (docs/simulation.md,
# "Calibration"), from measurements on this machine: the device from loom-sim-calibrate (Loom's
# own CPU ops at one thread, the share of one core a rank has when each rank has a core; and
# again with one copy per core running at once, for ranks that share the machine), the node's
# collective bandwidth and latency from loom-perf's shm allreduce on 2 ranks, and the core time
# a call takes from ranks that compute on every core (loom-perf --compute-us) and from ranks
# that wait for it at once, at 1, 2 and 4 ranks per core; and the spread of a rank's computation
# with every core busy (loom-sim-calibrate's shared round), for the simulator's stragglers.
# Usage: bash scripts/calibrate-this-machine.sh [--out FILE] [BUILD_DIR]
#        (defaults: sim/clusters/this-machine.json, build/release; the preset is compiled into
#        loom-sim, so after writing it rebuild, or give loom-sim the file: --cluster FILE)
set -euo pipefail
out=sim/clusters/this-machine.json  # (relative to the repository)
if [[ ${1:-} == --out ]]; then
  [[ -n ${2:-} ]] || { echo "calibrate-this-machine: --out needs a file name" >&2; exit 2; }
  out=$(realpath -m -- "$2")  # (relative to the caller's directory)
  shift 2
fi
cd "$(dirname "$0")/.."
build=${1:-build/release}
calibrate=$build/tools/loom_sim/loom-sim-calibrate
perf=$build/tools/loom_perf/loom-perf
for program in "$calibrate" "$perf"; do
  [[ -x $program ]] || { echo "calibrate-this-machine: $program is missing; build first" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The host has fast and slow spells of minutes: the device and the node are measured in three
# rounds, a rank alone, then every core busy, then the allreduce in each, and each figure is
# the median of its rounds (so the alone and shared rates come from the same spells).
cores=$(nproc)
rounds=3
runs=5  # of each call-cost measurement (below)
for ((round = 1; round <= rounds; ++round)); do
  echo "calibrate-this-machine: round $round of $rounds: device (loom-sim-calibrate --threads 1)" >&2
  "$calibrate" --threads 1 > "$work/device.$round.json"
  # The same with every core busy: one copy per core at once, their rates averaged (the rates
  # of ranks that share the cores' caches and memory bandwidth: device.shared).
  echo "calibrate-this-machine: round $round of $rounds: device with every core busy ($cores copies at once)" >&2
  pids=()
  for ((i = 0; i < cores; ++i)); do
    "$calibrate" --threads 1 > "$work/shared.$round.$i.json" 2> /dev/null &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  echo "calibrate-this-machine: round $round of $rounds: shm allreduce on 2 ranks (loom-perf)" >&2
  "$perf" allreduce --np 2 -b 8 -e 64M -f 8 -z 2 --json "$work/allreduce.$round.json" > /dev/null
done
# The core time one call takes from a rank that computes meanwhile (Note [A call's cost to a
# computing rank] in tools/loom_perf/runner.cpp), with 1, 2 and 4 ranks per core (with more
# ranks than cores a call also waits for peers the scheduler has set aside): 1 ms of
# computation per call, sizes from 8 KiB (smaller allreduces run on the caller's thread, not
# the progress thread's). And the same calls waited for at once, nothing computed between
# (node.comm_blocking_us: the hand-off and wake-ups of ranks that all wait). Five runs each,
# interleaved: runs a minute apart here gave 52 and 79 us (docs/simulation.md).
for per_core in 1 2 4; do
  ranks=$((cores * per_core))
  echo "calibrate-this-machine: a call's cost to computing and to waiting ranks ($ranks ranks, loom-perf)" >&2
  for ((run = 1; run <= runs; ++run)); do
    "$perf" allreduce --np "$ranks" -b 8K -e 512K -f 4 -z 2 --compute-us 1000 -n 100 -w 10 \
      --json "$work/loaded$per_core.$run.json" > /dev/null
    "$perf" allreduce --np "$ranks" -b 8K -e 512K -f 4 -z 2 -n 100 -w 10 \
      --json "$work/blocking$per_core.$run.json" > /dev/null
  done
done
python3 - "$work" "$cores" "$rounds" "$runs" "$out" <<'PY'
import datetime, json, os, platform, statistics, sys
work, out = sys.argv[1], sys.argv[5]
cores, rounds, runs = int(sys.argv[2]), range(1, int(sys.argv[3]) + 1), int(sys.argv[4])
def load(name): return json.load(open(os.path.join(work, name)))
def runs_of(kind):
    return {per_core: [load(f"{kind}{per_core}.{run}.json") for run in range(1, runs + 1)]
            for per_core in (1, 2, 4)}
def combine_curves(curves, stat):
    """Each size's rate over the curves that measured it, combined by `stat`."""
    rates = {}
    for curve in curves:
        for size, rate in curve:
            rates.setdefault(size, []).append(rate)
    return [[size, stat(r)] for size, r in sorted(rates.items())]
def combine(measurements, stat):
    """loom-sim-calibrate's outputs combined figure by figure."""
    out = {"op_overhead_us": stat([m["op_overhead_us"] for m in measurements]),
           "memory_gbps": combine_curves([m["memory_gbps"] for m in measurements], stat)}
    for key in ("gemm_tflops", "attention_tflops", "ops_gbps", "ops_tflops"):
        names = sorted({name for m in measurements for name in m[key]})
        out[key] = {name: combine_curves([m[key][name] for m in measurements if name in m[key]], stat)
                    for name in names}
    return out
device = combine([load(f"device.{r}.json") for r in rounds], statistics.median)
# The copies of one round ran at once: averaged; then the rounds' median.
shared = combine([combine([load(f"shared.{r}.{i}.json") for i in range(cores)], statistics.fmean)
                  for r in rounds], statistics.median)
# The spread of a rank's computation by interval (Note [The spread of a rank's computation] in
# tools/loom_sim/calibrate.cpp), from the shared round (every core computing, as ranks do at a
# meeting): by the windows' target, the copies of a round averaged, then the rounds' median.
def combined_spread(measurements, stat):
    by_target = [{int(t): p for t, p in m["compute_spread_us"].items()} for m in measurements]
    targets = sorted(set.intersection(*(set(b) for b in by_target)))
    return {t: (stat([b[t][0] for b in by_target]), stat([b[t][1] for b in by_target])) for t in targets}
rounds_spread = [combined_spread([load(f"shared.{r}.{i}.json") for i in range(cores)], statistics.fmean)
                 for r in rounds]
spread_targets = sorted(set.intersection(*(set(s) for s in rounds_spread)))
compute_spread = []
for t in spread_targets:
    length = statistics.median(s[t][0] for s in rounds_spread)
    if not compute_spread or length > compute_spread[-1][0]:  # (lengths increase)
        compute_spread.append([length, statistics.median(s[t][1] for s in rounds_spread)])
def busbw(row): return row["out_of_place"]["busbw_gbps"]
def time_us(row): return row["out_of_place"]["time_us"]
def median_of_rounds(figure):
    return statistics.median(figure(load(f"allreduce.{r}.json")["results"]) for r in rounds)
bus = median_of_rounds(lambda rows: statistics.median(busbw(r) for r in rows if r["size"] >= 2 << 20))
# A 2-rank ring allreduce takes 2 steps.
latency = median_of_rounds(lambda rows: statistics.median(time_us(r) for r in rows if r["size"] <= 4096)) / 2
# What loom-sim charges a call on a node whose cores are shared by k ranks each is k (the core
# time + the transfer it gives the same allreduce: a ring, 2 (n-1)/n size / bus bandwidth +
# 2 (n-1) steps), so the core time is each measured call's time / k less that transfer; the
# median over sizes and placements of each run, then over the runs.
def beyond_transfer(loaded, per_core):
    ranks = loaded["metadata"]["nranks"]
    def transfer_us(size):
        return 2 * (ranks - 1) / ranks * size / (bus * 1e3) + 2 * (ranks - 1) * latency
    costs = sorted(r[place]["time_us"] / per_core - transfer_us(r["size"])
                   for r in loaded["results"] for place in ("out_of_place", "in_place"))
    return costs[len(costs) // 2]
def call_costs(kind):
    return {per_core: sorted(beyond_transfer(run, per_core) for run in measured)
            for per_core, measured in runs_of(kind).items()}
def curve_of(costs): return [[per_core, max(0.0, statistics.median(c))] for per_core, c in costs.items()]
def described(costs, curve):
    return "; ".join(f"{k} per core {c:.1f} us, the runs {', '.join(f'{x:.1f}' for x in costs[k])}"
                     for k, c in curve)
loaded_costs, blocking_costs = call_costs("loaded"), call_costs("blocking")
comm_core, comm_blocking = curve_of(loaded_costs), curve_of(blocking_costs)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
isa = "AVX-512" if "avx512f" in open("/proc/cpuinfo").read() else "AVX2"
peak = max(rate for _, rate in device["gemm_tflops"]["f32"])
source = (f"This machine ({cpu}, {isa}, {cores} cores), measured {datetime.date.today()} by "
          "scripts/calibrate-this-machine.sh. Device: one rank's share of one core, from "
          "`loom-sim-calibrate --threads 1`: every op of real training steps of four small GPTs "
          "timed in the step, its work as the meta device counts it (tools/loom_sim/calibrate.cpp "
          "says which models). The bf16 GEMM curve is from the same steps under bf16 "
          "autocast (oneDNN's bf16 products where the CPU has them, else widened to f32); the "
          "f16 curves are the f32 ones (autocast emulates f16 in f32). Peaks: the best "
          "GEMM rate measured, so this machine's MFU is against what its GEMMs reach. Shared: "
          f"the same measured by {cores} copies at once, one per core, their rates "
          "averaged (ranks sharing the cores' caches and memory bandwidth). Both measured in "
          f"{len(rounds)} rounds, each rate the median of the rounds. Node: the "
          "shm backend, `loom-perf allreduce --np 2 -b 8 -e 64M -f 8 -z 2`, in each round: the median bus "
          f"bandwidth from 2 MiB ({bus:.2f} GB/s) and half the median time up to 4 KiB per "
          f"step ({latency:.2f} us), the median of the rounds. A call's core time while every core computes: "
          f"`loom-perf allreduce --np N -b 8K -e 512K -f 4 -z 2 --compute-us 1000` with N "
          f"{cores}, {2 * cores} and {4 * cores} (1, 2 and 4 ranks per core), each call's time "
          f"over the ranks per core less the transfer the node's figures above give, the median "
          f"over sizes and placements, of {runs} runs the median ("
          + described(loaded_costs, comm_core)
          + "). A call's core time when its ranks wait for it at once (node.comm_blocking_us): "
          "the same without --compute-us (" + described(blocking_costs, comm_blocking)
          + "). The spread of a rank's computation (node.compute_spread_us): the shared round's "
          "standard deviation, over its profiled steps, of the time of windows of consecutive ops "
          "of about 250 us, 1 ms and 4 ms (tools/loom_sim/calibrate.cpp, Note [The spread of a "
          "rank's computation]), by the windows' mean length, the copies averaged, the rounds' "
          f"median. One node: all ranks share its {cores} cores.")
spread_field = ("" if not compute_spread else ',\n           "compute_spread_us": [' +
                ", ".join(f"[{t:.4g}, {sigma:.3g}]" for t, sigma in compute_spread) + "]")
# Sizes in full: two sizes that agree in their first digits are still two points, in order.
def pairs(curve): return "[" + ", ".join(f"[{a:.10g}, {b:.4g}]" for a, b in curve) + "]"
def by_key(curves, indent):
    pad = " " * indent
    return "{\n" + ",\n".join(f'{pad}  "{k}": {pairs(v)}' for k, v in curves.items()) + f"\n{pad}}}"
text = f'''{{
  "name": "this-machine",
  "source": {json.dumps(source)},
  "device": {{
    "name": {json.dumps(cpu + ", one core per rank")},
    "memory_gib": {os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30:.0f},
    "peak_tflops": {{"f32": {peak:.4g}, "bf16": {peak:.4g}, "f16": {peak:.4g}}},
    "op_overhead_us": {device["op_overhead_us"]:.3g},
    "gemm_tflops": {by_key(device["gemm_tflops"], 4)},
    "attention_tflops": {by_key(device["attention_tflops"], 4)},
    "memory_gbps": {pairs(device["memory_gbps"])},
    "ops_gbps": {by_key(device["ops_gbps"], 4)},
    "ops_tflops": {by_key(device["ops_tflops"], 4)},
    "shared": {{
      "op_overhead_us": {shared["op_overhead_us"]:.3g},
      "gemm_tflops": {by_key(shared["gemm_tflops"], 6)},
      "attention_tflops": {by_key(shared["attention_tflops"], 6)},
      "memory_gbps": {pairs(shared["memory_gbps"])},
      "ops_gbps": {by_key(shared["ops_gbps"], 6)},
      "ops_tflops": {by_key(shared["ops_tflops"], 6)}
    }}
  }},
  "node": {{"devices": 1024, "compute_slots": {cores}, "busbw_gbps": {bus:.3g}, "latency_us": {latency:.3g},
           "comm_core_us": [{", ".join(f"[{k}, {c:.3g}]" for k, c in comm_core)}],
           "comm_blocking_us": [{", ".join(f"[{k}, {c:.3g}]" for k, c in comm_blocking)}]{spread_field}}},
  "network": {{"nics_per_node": 0}},
  "collective_base_latency_us": 0,
  "host": {{"pcie_gbps": {device["memory_gbps"][-1][1]:.3g}}}
}}
'''
json.loads(text)
tmp = out + ".tmp"
open(tmp, "w").write(text)
os.replace(tmp, out)
print(f"calibrate-this-machine: wrote {out}", file=sys.stderr)
PY
