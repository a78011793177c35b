#!/usr/bin/env python3
"""Small allreduces, Loom against Open MPI on this host, interleaved, medians of rounds:

    python3 bench/comm/small_allreduce_vs_mpi.py [--build build/release] [--rounds 9]
        [-b 8] [-e 4K] [-f 8] [-n 20000] [-w 2000] [--modes 0,1]

Each round runs `loom-perf allreduce --np 2` once per blocking mode (-z 0: asynchronous calls
issued back to back, waited for at the end; -z 1: synchronous; -z 2: each waited for at
once), then `mpirun -np 2 mpi_allreduce_perf` (blocking MPI_Allreduce, `--bind-to none` like
loom-perf's default), with the same sizes and counts, float sum, out of place. Prints per
size the median time of each and the median over rounds of Loom's time over Open MPI's in the
same round: the host's fast and slow spells move both (docs/performance_comm.md). Issue 12's
goal is `-z 0` within 1.2x of Open MPI from 8 B to 4 KiB. Also prints the share of CPU time
the hypervisor stole during the runs.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile


def cpu_jiffies() -> tuple:
    """(steal, total) over all CPUs from /proc/stat: the share of time the hypervisor ran
    something else while this VM wanted the CPU, one sign of the host's slow mode."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return fields[7] if len(fields) > 7 else 0, sum(fields[:8])


def core_to_core(build: str) -> str:
    """The median one-way core-to-core latency from bench/core_to_core, or why there is none."""
    probe = os.path.join(build, "bench/core_to_core")
    if not os.access(probe, os.X_OK):
        return f"({probe} not built)"
    out = subprocess.run([probe, "--round-trips", "200000"], check=True, capture_output=True,
                         text=True).stdout
    return next(line.split()[1] for line in out.splitlines() if line.startswith("median_ns")) + " ns"


def times(path: str) -> dict:
    with open(path) as f:
        return {r["size"]: r["out_of_place"]["time_us"] for r in json.load(f)["results"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build/release")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="4K")
    p.add_argument("-f", default="8")
    p.add_argument("-n", default="20000")
    p.add_argument("-w", default="2000")
    p.add_argument("--modes", default="0,1", help="loom-perf -z values, comma-separated")
    args = p.parse_args()
    loom = os.path.join(args.build, "tools/loom_perf/loom-perf")
    mpi = os.path.join(args.build, "bench/peers/mpi_allreduce_perf")
    for program in (loom, mpi):
        if not os.access(program, os.X_OK):
            raise SystemExit(f"{program} is missing: build {args.build} first (mpi_allreduce_perf "
                             "needs Open MPI: scripts/install-deps.sh)")
    sweep = ["-b", args.b, "-e", args.e, "-f", args.f, "-n", args.n, "-w", args.w, "-c", "0"]
    modes = [int(z) for z in args.modes.split(",")]
    runs = {}  # name -> [per-round {size: us}]
    latency_before = core_to_core(args.build)
    steal_before, total_before = cpu_jiffies()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        for _ in range(args.rounds):
            for z in modes:
                subprocess.run([loom, "allreduce", "--np", "2", *sweep, "-z", str(z),
                                "--json", out], check=True, stdout=subprocess.DEVNULL)
                runs.setdefault(f"loom -z {z}", []).append(times(out))
            subprocess.run(["mpirun", "--allow-run-as-root", "--bind-to", "none", "-np", "2", mpi,
                            *sweep, "--json", out], check=True, stdout=subprocess.DEVNULL)
            runs.setdefault("Open MPI", []).append(times(out))
    steal_after, total_after = cpu_jiffies()
    steal = 100 * (steal_after - steal_before) / max(total_after - total_before, 1)
    print(f"steal time during the runs: {steal:.1f}% of CPU time (/proc/stat)")
    print(f"one-way core-to-core latency before and after: {latency_before}, "
          f"{core_to_core(args.build)} (bench/core_to_core)")
    names = [f"loom -z {z}" for z in modes]
    print(f"{'size':>6} {'Open MPI us':>12}" + "".join(f" {n + ' us (ratio)':>22}" for n in names))
    for size in sorted(runs["Open MPI"][0]):
        base = [r[size] for r in runs["Open MPI"]]
        line = f"{size:>6} {statistics.median(base):>12.3f}"
        for n in names:
            mine = [r[size] for r in runs[n]]
            ratio = statistics.median(m / b for m, b in zip(mine, base))
            line += f" {statistics.median(mine):>13.3f} ({ratio:.2f}x)"
        print(line)


if __name__ == "__main__":
    main()
