#!/usr/bin/env python3
"""Summarises bench/sharding/vs_peers.sh: per configuration, Loom's and the peer's step time
(the slowest rank's median, then the median over rounds), their ratio, and Loom's per-rank
model-state memory; then the disk bandwidth fio measured, or a line saying it was not (the
script skips fio where it is not installed). Prints a Markdown table."""
import glob
import json
import os
import re
import statistics
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "build/bench-sharding"
labels = []
for path in sorted(glob.glob(os.path.join(out, "loom_*_r*.json"))):
    label = re.match(r"loom_(.*)_r\d+\.json", os.path.basename(path)).group(1)
    if label not in labels:
        labels.append(label)


def loom_runs(label):
    times, docs = [], []
    for path in sorted(glob.glob(os.path.join(out, f"loom_{label}_r*.json"))):
        doc = json.load(open(path))
        docs.append(doc)
        times.append(max(r["step_ms"] for r in doc["results"]))
    return times, docs


def peer_runs(label):
    times = []
    for rnd in sorted({re.search(r"_r(\d+)\.rank", p).group(1)
                       for p in glob.glob(os.path.join(out, f"peer_{label}_r*.rank*.json"))}):
        ranks = [json.load(open(p)) for p in glob.glob(os.path.join(out, f"peer_{label}_r{rnd}.rank*.json"))]
        if len(ranks) == 2:
            times.append(max(r["median_ms_5_19"] for r in ranks))
    return times


print("| configuration | Loom ms/step | peer ms/step | Loom / peer | Loom model states MiB/rank | rounds |")
print("|---|---|---|---|---|---|")
for label in labels:
    loom, docs = loom_runs(label)
    peer = peer_runs(label)
    lm = statistics.median(loom) if loom else float("nan")
    pm = statistics.median(peer) if peer else float("nan")
    states = "-"
    if docs:
        kinds = max(docs[-1]["results"], key=lambda r: r["peak_bytes"])["peak_bytes_by_kind"]
        states = "%.1f" % (sum(kinds[k] for k in ("parameters", "gradients", "optimizer_state")) / 2**20)
        if kinds.get("offloaded"):
            states += " (+%.1f offloaded)" % (kinds["offloaded"] / 2**20)
    ratio = lm / pm if peer else float("nan")
    print(f"| {label} | {lm:.0f} | {pm:.0f} | {ratio:.2f} | {states} | {len(loom)}/{len(peer)} |")
for rw in ("write", "read"):
    path = os.path.join(out, f"fio_{rw}.json")
    if os.path.exists(path):
        job = json.load(open(path))["jobs"][0][rw]
        print(f"\nfio sequential {rw}, 1 MiB blocks, O_DIRECT: {job['bw'] / 1024:.0f} MiB/s")
    else:
        print(f"\nfio sequential {rw}: not measured (no {os.path.basename(path)}: fio was not"
              " installed or failed)")
machine = os.path.join(out, "machine.txt")
if os.path.exists(machine):
    print("\n" + open(machine).read())
