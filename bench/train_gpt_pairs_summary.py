#!/usr/bin/env python3
"""The table of a bench script that runs train_gpt and a Python peer in interleaved pairs
(bench/cpu_step/vs_torch.sh, bench/parallelism/vs_peers.sh): per label, Loom's median step
from step 5 on (its --metrics file) and the peer's slowest rank's median_ms_5_19, each round,
and the ratio of the medians over rounds.

    python3 bench/train_gpt_pairs_summary.py OUTDIR ROUNDS LABEL [LABEL ...]
"""
import glob
import json
import statistics
import sys

out, rounds, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]


def loom(label, r):
    steps = [json.loads(line)["ms_per_step"] for line in open(f"{out}/loom_{label}_r{r}.jsonl")]
    return statistics.median(steps[5:])


def peer(label, r):
    files = glob.glob(f"{out}/peer_{label}_r{r}.rank*.json")
    return max(json.load(open(f))["median_ms_5_19"] for f in files) if files else float("nan")


print("| run | Loom ms/step (rounds) | PyTorch ms/step | Loom / PyTorch (medians) |")
print("|---|---|---|---|")
for label in labels:
    a = [loom(label, r) for r in range(1, rounds + 1)]
    b = [peer(label, r) for r in range(1, rounds + 1)]
    print(f"| {label} | {', '.join(f'{x:.1f}' for x in a)} | {', '.join(f'{x:.1f}' for x in b)} | "
          f"{statistics.median(a) / statistics.median(b):.2f} |")
