#!/usr/bin/env bash
# Writes sim/clusters/this-machine.json, loom-sim's default cluster (docs/simulation.md,
# "Calibration"), from measurements on this machine: the device from loom-sim-calibrate (Loom's
# own CPU ops at one thread, the share of one core a rank has when each rank has a core; and
# again with one copy per core running at once, for ranks that share the machine), the node's
# collective bandwidth and latency from loom-perf's shm allreduce on 2 ranks, and the core time
# a call takes from ranks that compute on every core (loom-perf --compute-us).
# Usage: bash scripts/calibrate-this-machine.sh [BUILD_DIR]   (default build/release)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
calibrate=$build/tools/loom_sim/loom-sim-calibrate
perf=$build/tools/loom_perf/loom-perf
for program in "$calibrate" "$perf"; do
  [[ -x $program ]] || { echo "calibrate-this-machine: $program is missing; build first" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "calibrate-this-machine: device (loom-sim-calibrate --threads 1)" >&2
"$calibrate" --threads 1 > "$work/device.json"
# The same with every core busy: one copy per core at once, their rates averaged (the rates
# of ranks that share the cores' caches and memory bandwidth: device.shared).
cores=$(nproc)
echo "calibrate-this-machine: device with every core busy ($cores copies at once)" >&2
pids=()
for ((i = 0; i < cores; ++i)); do
  "$calibrate" --threads 1 > "$work/shared$i.json" 2> /dev/null &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
echo "calibrate-this-machine: shm allreduce on 2 ranks (loom-perf)" >&2
"$perf" allreduce --np 2 -b 8 -e 64M -f 8 -z 2 --json "$work/allreduce.json" > /dev/null
# The core time one call takes from a rank that computes meanwhile, one rank per core (Note [A
# call's cost to a computing rank] in tools/loom_perf/runner.cpp): 1 ms of computation per call,
# sizes from 8 KiB (smaller allreduces run on the caller's thread, not the progress thread's).
# Three runs: one run's figure moved from 8 to 59 us within minutes here (docs/simulation.md).
echo "calibrate-this-machine: a call's cost to computing ranks ($cores ranks, loom-perf --compute-us)" >&2
for run in 1 2 3; do
  "$perf" allreduce --np "$cores" -b 8K -e 512K -f 4 -z 2 --compute-us 1000 -n 300 -w 30 \
    --json "$work/loaded$run.json" > /dev/null
done
python3 - "$work/device.json" "$work/allreduce.json" sim/clusters/this-machine.json \
  "$work"/loaded{1,2,3}.json "$work"/shared*.json <<'PY'
import datetime, json, os, platform, sys
device = json.load(open(sys.argv[1]))
perf = json.load(open(sys.argv[2]))
loaded_runs = [json.load(open(path)) for path in sys.argv[4:7]]
copies = [json.load(open(path)) for path in sys.argv[7:]]
def mean_curve(curves):
    """Each size's rate averaged over the copies that measured it."""
    rates = {}
    for curve in curves:
        for size, rate in curve:
            rates.setdefault(size, []).append(rate)
    return [[size, sum(r) / len(r)] for size, r in sorted(rates.items())]
def mean_by_key(key):
    names = sorted({name for copy in copies for name in copy[key]})
    return {name: mean_curve([copy[key][name] for copy in copies if name in copy[key]])
            for name in names}
shared = {key: mean_by_key(key) for key in ("gemm_tflops", "attention_tflops", "ops_gbps", "ops_tflops")}
shared["memory_gbps"] = mean_curve([copy["memory_gbps"] for copy in copies])
rows = perf["results"]
def busbw(row): return row["out_of_place"]["busbw_gbps"]
def time_us(row): return row["out_of_place"]["time_us"]
large = [busbw(r) for r in rows if r["size"] >= 2 << 20]
small = [time_us(r) for r in rows if r["size"] <= 4096]
bus = sorted(large)[len(large) // 2]
latency = sorted(small)[len(small) // 2] / 2  # a 2-rank ring allreduce takes 2 steps
# Beyond the transfer loom-sim gives the same allreduce (a ring: 2 (n-1)/n size / bus bandwidth
# + 2 (n-1) steps); the median over sizes and placements of each run, then over the runs.
def beyond_transfer(loaded):
    ranks = loaded["metadata"]["nranks"]
    def transfer_us(size):
        return 2 * (ranks - 1) / ranks * size / (bus * 1e3) + 2 * (ranks - 1) * latency
    costs = sorted(r[place]["time_us"] - transfer_us(r["size"]) for r in loaded["results"]
                   for place in ("out_of_place", "in_place"))
    return costs[len(costs) // 2]
runs = sorted(beyond_transfer(loaded) for loaded in loaded_runs)
comm_core = max(0.0, runs[1])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
isa = "AVX-512" if "avx512f" in open("/proc/cpuinfo").read() else "AVX2"
cores = os.cpu_count()
peak = max(rate for _, rate in device["gemm_tflops"]["f32"])
source = (f"This machine ({cpu}, {isa}, {cores} cores), measured {datetime.date.today()} by "
          "scripts/calibrate-this-machine.sh. Device: one rank's share of one core, from "
          "`loom-sim-calibrate --threads 1`: every op of real training steps of four small GPTs "
          "timed in the step, its work as the meta device counts it (tools/loom_sim/calibrate.cpp "
          "says which models). The bf16 GEMM curve is from the same steps under bf16 "
          "autocast (oneDNN's bf16 products where the CPU has them, else widened to f32); the "
          "f16 curves are the f32 ones (autocast emulates f16 in f32). Peaks: the best "
          "GEMM rate measured, so this machine's MFU is against what its GEMMs reach. Shared: "
          f"the same measured by {len(copies)} copies at once, one per core, their rates "
          "averaged (ranks sharing the cores' caches and memory bandwidth). Node: the "
          "shm backend, `loom-perf allreduce --np 2 -b 8 -e 64M -f 8 -z 2`: the median bus "
          f"bandwidth from 2 MiB ({bus:.2f} GB/s) and half the median time up to 4 KiB per "
          f"step ({latency:.2f} us). A call's core time while every core computes: "
          f"`loom-perf allreduce --np {cores} -b 8K -e 512K -f 4 -z 2 --compute-us 1000`, "
          f"less the transfer the node's figures above give, the median over sizes and "
          f"placements, of three runs the median ({comm_core:.1f} us; the runs "
          f"{', '.join(f'{x:.1f}' for x in runs)}). One node: all ranks share its {cores} cores.")
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
      "op_overhead_us": {device["op_overhead_us"]:.3g},
      "gemm_tflops": {by_key(shared["gemm_tflops"], 6)},
      "attention_tflops": {by_key(shared["attention_tflops"], 6)},
      "memory_gbps": {pairs(shared["memory_gbps"])},
      "ops_gbps": {by_key(shared["ops_gbps"], 6)},
      "ops_tflops": {by_key(shared["ops_tflops"], 6)}
    }}
  }},
  "node": {{"devices": 1024, "compute_slots": {cores}, "busbw_gbps": {bus:.3g}, "latency_us": {latency:.3g},
           "comm_core_us": {comm_core:.3g}}},
  "network": {{"nics_per_node": 0}},
  "collective_base_latency_us": 0,
  "host": {{"pcie_gbps": {device["memory_gbps"][-1][1]:.3g}}}
}}
'''
json.loads(text)
tmp = sys.argv[3] + ".tmp"
open(tmp, "w").write(text)
os.replace(tmp, sys.argv[3])
print(f"calibrate-this-machine: wrote {sys.argv[3]}", file=sys.stderr)
PY
