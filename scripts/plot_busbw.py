#!/usr/bin/env python3
"""Plot bus bandwidth against message size from loom-perf and peer benchmark JSON files.

Reads the JSON written by `loom-perf --json`, bench/peers/mpi_allreduce_perf --json and
bench/peers/gloo_allreduce_perf --json ({"metadata": {...}, "results": [...]}) and draws
one line per label: busbw (GB/s) against size (bytes, log2 axis). Files given the same
label (repeated runs) are merged by taking the median per size.

    python3 scripts/plot_busbw.py --json loom.json --json mpi.json --json gloo.json \
        --out docs/img/allreduce_busbw.png
    python3 scripts/plot_busbw.py --json a.json --label "Loom shm" --json b.json --label MPI ...

--label applies to the --json given just before it; without one, the label is the file's
metadata "implementation" (loom, openmpi, gloo).
"""
import argparse
import json
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after selecting the backend)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="append", required=True, metavar="FILE",
                        help="a benchmark JSON file (repeat for more lines)")
    parser.add_argument("--label", action="append", default=[], metavar="TEXT",
                        help="label of the preceding --json (default: its implementation)")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--placement", choices=["out_of_place", "in_place", "best"],
                        default="out_of_place",
                        help="which column to plot (best: the higher of the two)")
    parser.add_argument("--title", default=None)
    parser.add_argument("--dpi", type=int, default=100)
    # Pair each --label with the --json before it.
    labels = {}
    last_json = None
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == "--json" and i + 1 < len(argv):
            last_json = len([a for a in argv[:i] if a == "--json"])
        elif arg == "--label" and i + 1 < len(argv):
            if last_json is None:
                parser.error("--label must follow the --json it names")
            labels[last_json] = argv[i + 1]
    args = parser.parse_args()
    args.labels = labels
    return args


def busbw_of(row, placement):
    cells = [row.get("out_of_place"), row.get("in_place")]
    if placement == "out_of_place":
        cells = [cells[0] or cells[1]]  # collectives without an out-of-place form
    elif placement == "in_place":
        cells = [cells[1] or cells[0]]
    values = [c["busbw_gbps"] for c in cells if c]
    return max(values) if values else None


def main():
    args = parse_args()
    series = {}  # label -> size -> [busbw, ...]
    collective = None
    for index, path in enumerate(args.json):
        with open(path) as f:
            data = json.load(f)
        meta = data.get("metadata", {})
        collective = collective or meta.get("collective")
        label = args.labels.get(index, meta.get("implementation", path))
        points = series.setdefault(label, {})
        for row in data["results"]:
            value = busbw_of(row, args.placement)
            if value is not None and row["size"] > 0:
                points.setdefault(row["size"], []).append(value)

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points in series.items():
        sizes = sorted(points)
        ax.plot(sizes, [statistics.median(points[s]) for s in sizes], marker="o",
                markersize=3, linewidth=1.5, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    title = args.title or f"{collective or 'collective'} bus bandwidth ({args.placement})"
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=args.dpi)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
