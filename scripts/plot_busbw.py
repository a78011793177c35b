#!/usr/bin/env python3
"""Plot bus bandwidth against message size from loom-perf and peer benchmark JSON files.

Reads the JSON written by `loom-perf --json`, bench/peers/mpi_allreduce_perf --json and
bench/peers/gloo_allreduce_perf --json ({"metadata": {...}, "results": [...]}) and draws
one line per label: busbw (GB/s) against size (bytes, log2 axis). Files given the same
label (repeated runs) are merged by taking the median per size.

    python3 scripts/plot_busbw.py --json loom.json --json mpi.json --json gloo.json \
        --out docs/img/allreduce_busbw.png
    python3 scripts/plot_busbw.py --json loom_1.json loom_2.json loom_3.json --label "Loom" \
        --json mpi_1.json mpi_2.json mpi_3.json --label "Open MPI" --out busbw.png

Each --json takes the files of one line; the i-th --label names the i-th line (default:
the files' metadata "implementation": loom, openmpi, gloo).
"""
import argparse
import json
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after selecting the backend)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="append", nargs="+", required=True, metavar="FILE",
                        help="benchmark JSON files of one line (repeat --json for more lines)")
    parser.add_argument("--label", action="append", default=[], metavar="TEXT",
                        help="the i-th --label names the i-th --json group "
                             "(default: the files' metadata implementation)")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--placement", choices=["out_of_place", "in_place", "both"],
                        default="both",
                        help="which column to plot (both: in place dashed, same colour)")
    parser.add_argument("--title", default=None)
    parser.add_argument("--dpi", type=int, default=100)
    args = parser.parse_args()
    if len(args.label) > len(args.json):
        parser.error("more --label than --json groups")
    return args


def busbw_of(row, placement):
    cell = row.get(placement)
    return cell["busbw_gbps"] if cell else None  # null: no such form (e.g. Loom broadcast)


def main():
    args = parse_args()
    placements = ["out_of_place", "in_place"] if args.placement == "both" else [args.placement]
    series = {}  # label -> placement -> size -> [busbw, ...]
    collective = None
    files = [(group, path) for group, paths in enumerate(args.json) for path in paths]
    for group, path in files:
        with open(path) as f:
            data = json.load(f)
        meta = data.get("metadata", {})
        collective = collective or meta.get("collective")
        label = args.label[group] if group < len(args.label) else meta.get("implementation", path)
        for placement in placements:
            points = series.setdefault(label, {}).setdefault(placement, {})
            for row in data["results"]:
                value = busbw_of(row, placement)
                if value is not None and row["size"] > 0:
                    points.setdefault(row["size"], []).append(value)

    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {"out_of_place": "-", "in_place": "--"}
    for index, (label, by_placement) in enumerate(series.items()):
        colour = f"C{index}"
        for placement, points in by_placement.items():
            sizes = sorted(points)
            if not sizes:
                continue
            name = label if len(placements) == 1 else f"{label}, {placement.replace('_', '-')}"
            ax.plot(sizes, [statistics.median(points[s]) for s in sizes], styles[placement],
                    color=colour, marker="o", markersize=2.5, linewidth=1.3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    title = args.title or f"{collective or 'collective'} bus bandwidth"
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=args.dpi)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
