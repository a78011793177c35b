#!/usr/bin/env python3
"""The table of a bench script that runs train_gpt and a Python peer in interleaved pairs
(bench/cpu_step/vs_torch.sh, bench/parallelism/vs_peers.sh): per label, Loom's median step
from step 5 on (its --metrics file) and the peer's slowest rank's median_ms_5_19, each round,
and the ratio of the medians over rounds. Then, where the runs report it, memory as issue 47
compares it: each process's peak RSS above its RSS before the model was built (train_gpt's
chief rank; the peer's largest rank), the largest over rounds.

    python3 bench/train_gpt_pairs_summary.py OUTDIR ROUNDS LABEL [LABEL ...]
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_results import loom_ms, loom_rss_above_start, peer_ms, peer_rss_above_start  # noqa: E402

out, rounds, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ROUNDS = range(1, rounds + 1)

print("| run | Loom ms/step (rounds) | PyTorch ms/step | Loom / PyTorch (medians) |")
print("|---|---|---|---|")
for label in labels:
    a = [loom_ms(out, label, r) for r in ROUNDS]
    b = [peer_ms(out, label, r) for r in ROUNDS]
    print(f"| {label} | {', '.join(f'{x:.1f}' for x in a)} | {', '.join(f'{x:.1f}' for x in b)} | "
          f"{statistics.median(a) / statistics.median(b):.2f} |")

rows = []
for label in labels:
    a = [loom_rss_above_start(out, label, r) for r in ROUNDS]
    b = [peer_rss_above_start(out, label, r) for r in ROUNDS]
    if None not in a and None not in b:
        rows.append(f"| {label} | {max(a):.1f} | {max(b):.1f} | {max(a) / max(b):.2f} |")
if rows:
    print()
    print("| run | Loom peak RSS above start, MiB | PyTorch's, MiB | Loom / PyTorch |")
    print("|---|---:|---:|---:|")
    print("\n".join(rows))
