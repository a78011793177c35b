#!/usr/bin/env python3
"""Two loom-perf binaries side by side on small allreduces, interleaved, medians of rounds:

    python3 bench/comm/ab_allreduce.py BASELINE_LOOM_PERF CANDIDATE_LOOM_PERF [--rounds 7]
        [-b 8] [-e 64K] [-f 2] [-n 2000] [-w 200] [--np 2] [--bind core] [--modes 0,1]

Each round runs both binaries at -z 0, then both at -z 1 (out of place and in place, shm
backend, --bind core unless told otherwise), the baseline first in even rounds and the candidate first in odd ones:
the machine's fast and slow spells fall on both, and so does the penalty of running second
(identical binaries measure 2-9% apart in a fixed order on this machine). Prints per size and mode the median time of each binary and the median
over rounds of candidate / baseline. Used for the cost of the shm backend's always-on
fingerprints (docs/reliability.md): BASELINE built from the commit before them.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile


def run(binary: str, blocking: int, args: argparse.Namespace, out: str) -> dict:
    subprocess.run([binary, "allreduce", "--np", str(args.np), "--bind", args.bind, "-b", args.b,
                    "-e", args.e, "-f", args.f, "-n", str(args.n), "-w", str(args.w), "-c", "0",
                    "-z", str(blocking), "--json", out],
                   check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return {(r["size"], place): r[place]["time_us"] for r in json.load(f)["results"]
                for place in ("out_of_place", "in_place") if isinstance(r.get(place), dict)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("baseline")
    p.add_argument("candidate")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="64K")
    p.add_argument("-f", default="2")
    p.add_argument("-n", type=int, default=2000)
    p.add_argument("-w", type=int, default=200)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--bind", default="core", choices=("core", "none"))
    p.add_argument("--modes", default="0,1", help="loom-perf -z values, comma-separated")
    args = p.parse_args()
    modes = [int(z) for z in args.modes.split(",")]
    times = {}  # (blocking, binary) -> [per-round {(size, place): us}]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        for round_number in range(args.rounds):
            order = ("baseline", "candidate") if round_number % 2 == 0 else ("candidate", "baseline")
            for blocking in modes:
                for name in order:
                    times.setdefault((blocking, name), []).append(
                        run(getattr(args, name), blocking, args, out))
    print(f"{'-z':>2} {'size':>8} {'place':>12} {'baseline us':>12} {'candidate us':>13} "
          f"{'ratio':>6}")
    for blocking in modes:
        base, cand = times[(blocking, "baseline")], times[(blocking, "candidate")]
        for key in sorted(base[0]):
            ratios = [c[key] / b[key] for b, c in zip(base, cand)]
            print(f"{blocking:>2} {key[0]:>8} {key[1]:>12} "
                  f"{statistics.median(b[key] for b in base):>12.3f} "
                  f"{statistics.median(c[key] for c in cand):>13.3f} "
                  f"{statistics.median(ratios):>6.3f}")


if __name__ == "__main__":
    main()
