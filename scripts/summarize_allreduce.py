#!/usr/bin/env python3
"""Median table of scripts/bench_allreduce_peers.sh's JSON: 8 B latency and busbw at
1 MiB, 16 MiB and 256 MiB, out of place / in place, for Loom, Open MPI and Gloo."""
import json
import statistics
import sys


def load(path):
    with open(path) as f:
        return {row["size"]: row for row in json.load(f)["results"]}


def median(out, reps, name, size, field, placement):
    values = []
    for rep in range(1, reps + 1):
        row = load(f"{out}/{name}_{rep}.json").get(size)
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
    for label, sweep, lat in rows:
        cells = [" / ".join(f"{median(out, reps, lat, 8, 'time_us', p):.2f}" for p in ("out_of_place", "in_place"))]
        for size, _ in sizes:
            cells.append(" / ".join(f"{median(out, reps, sweep, size, 'busbw_gbps', p):.2f}"
                                    for p in ("out_of_place", "in_place")) if sweep else "")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
