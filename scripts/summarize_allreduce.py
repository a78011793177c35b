#!/usr/bin/env python3
"""Median table of scripts/bench_allreduce_peers.sh's JSON: 8 B latency and busbw at
1 MiB, 16 MiB and 256 MiB, out of place / in place, for Loom, Open MPI and Gloo. An
implementation with no files (Gloo's peer where it was not built) gets a note instead of a row."""
import json
import os
import statistics
import sys


def load(path):
    with open(path) as f:
        return {row["size"]: row for row in json.load(f)["results"]}


def median(out, reps, name, size, field, placement):
    values = []
    for rep in range(1, reps + 1):
        path = f"{out}/{name}_{rep}.json"
        row = load(path).get(size) if os.path.exists(path) else None
        if row and row.get(placement) and row[placement].get(field) is not None:
            values.append(row[placement][field])
    return statistics.median(values) if values else float("nan")


def main():
    out, reps = sys.argv[1], int(sys.argv[2])
    sizes = [(1 << 20, "1 MiB"), (16 << 20, "16 MiB"), (256 << 20, "256 MiB")]
    print("| implementation | 8 B latency (us) | " + " | ".join(f"busbw {n} (GB/s)" for _, n in sizes) + " |")
    print("|---|---:|" + "---:|" * len(sizes))
    rows = [("Loom (`-z 0`)", "loom", "lat_loom"), ("Loom (`-z 1`, async_op=false)", None, "lat_loomz1"),
            ("Open MPI", "mpi", "lat_mpi"), ("Gloo (TCP)", "gloo", "lat_gloo")]
    missing = []
    for label, sweep, lat in rows:
        if not any(os.path.exists(f"{out}/{lat}_{rep}.json") for rep in range(1, reps + 1)):
            missing.append(label)
            continue
        cells = [" / ".join(f"{median(out, reps, lat, 8, 'time_us', p):.2f}" for p in ("out_of_place", "in_place"))]
        for size, _ in sizes:
            cells.append(" / ".join(f"{median(out, reps, sweep, size, 'busbw_gbps', p):.2f}"
                                    for p in ("out_of_place", "in_place")) if sweep else "")
        print(f"| {label} | " + " | ".join(cells) + " |")
    for label in missing:
        print(f"\n{label}: not measured (no {lat}_N.json in {out}: its peer was not built)")


if __name__ == "__main__":
    main()
