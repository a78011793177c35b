#!/usr/bin/env python3
"""size_sweep.sh's table: per shape and run, Loom's and PyTorch's median steps (over rounds of
the median from step 5 on), their ratio, and each one's FLOP/s as a share of the FMA peak;
then each one's peak RSS above its RSS before the model was built (the largest over rounds).

    python3 bench/cpu_step/size_sweep_summary.py OUTDIR ROUNDS SHAPE [SHAPE ...]
"""
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from run_results import loom_ms, loom_rss_above_start, peer_ms, peer_rss_above_start  # noqa: E402

out, rounds, shapes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
fma_gflops, isa = open(f"{out}/fma.txt").read().split()
fma_gflops = float(fma_gflops)
THREADS = {"single_1thread": 1, "single_2threads": 2, "single_compile": 1, "ddp_2x1": 2,
           "single_1thread_bf16": 1}


def flag(args, name):
    return int(args[args.index(name) + 1])


print(f"Host: {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}, "
      f"FMA peak {fma_gflops:.0f} GFLOP/s per core ({isa}, loom_bench)")
print()
print("| shape | run | Loom ms | PyTorch ms | Loom / PyTorch | Loom % of FMA | PyTorch % of FMA |")
print("|---|---|---:|---:|---:|---:|---:|")
for shape in shapes:
    d = f"{out}/{shape}"
    args = open(f"{d}/model_args.txt").read().split()
    layers, embd, ctx, batch = (flag(args, n) for n in ("--layers", "--embd", "--ctx", "--batch"))
    # The parameter count single.py reports (the DDP peer does not), the same model in every run.
    counts = [json.load(open(f)).get("nparam") for f in glob.glob(f"{d}/peer_*.rank0.json")]
    nparam = next((n for n in counts if n), None)
    for label in THREADS:
        if not glob.glob(f"{d}/loom_{label}_r1.jsonl"):
            continue
        a = statistics.median(loom_ms(d, label, r) for r in range(1, rounds + 1))
        b = statistics.median(peer_ms(d, label, r) for r in range(1, rounds + 1))
        ranks = 2 if label == "ddp_2x1" else 1
        flops = (6.0 * nparam + 12.0 * layers * embd * ctx) * batch * ctx * ranks if nparam else 0
        peak = fma_gflops * 1e9 * THREADS[label]
        share = lambda ms: f"{100 * flops / (ms / 1e3) / peak:.0f}%" if flops else "-"
        print(f"| {shape} | {label} | {a:.1f} | {b:.1f} | {a / b:.2f} | {share(a)} | {share(b)} |")

memory = []
for shape in shapes:
    d = f"{out}/{shape}"
    for label in THREADS:
        if not glob.glob(f"{d}/loom_{label}_r1.jsonl"):
            continue
        a = [loom_rss_above_start(d, label, r) for r in range(1, rounds + 1)]
        b = [peer_rss_above_start(d, label, r) for r in range(1, rounds + 1)]
        if None not in a and None not in b:
            memory.append(f"| {shape} | {label} | {max(a):.1f} | {max(b):.1f} | "
                          f"{max(a) / max(b):.2f} |")
if memory:
    print()
    print("| shape | run | Loom peak RSS above start, MiB | PyTorch's, MiB | Loom / PyTorch |")
    print("|---|---|---:|---:|---:|")
    print("\n".join(memory))
