#!/usr/bin/env python3
"""Sums Nsight Compute's per-kernel GPU time by kind of kernel.

Reads the CSV that `scripts/gpu-prebuilt.sh run kernels` writes (ncu --metrics
gpu__time_duration.sum --csv over STEPS steps of train_gpt) and prints, per kind of kernel,
the launches and milliseconds per step and the share of the total, as a Markdown table
(docs/cuda.md, "Results on a GPU"); with --top N, also the N costliest kernels by name.

    python3 scripts/summarize_kernels.py FILE.kernels.csv [--steps 2] [--top 20]
"""
import argparse
import collections
import csv
import re
import sys

# First match wins: (kind, pattern on the demangled kernel name).
KINDS = [
    ("GEMMs (cuBLASLt)", r"nvjet|gemm|cutlass|sm90_xmma"),
    ("attention (forward, backward, delta)", r"attention"),
    ("dtype casts (f32 <-> bf16)",
     r"convert_vec8|copy_kernel<float, __nv_bfloat16>|copy_kernel<__nv_bfloat16, float>"),
    ("strided f32 copies", r"copy_kernel<float, float>"),
    ("column sums (bias gradients)", r"reduce_columns|column_partials|finish_columns"),
    ("layer norm", r"layer_norm"),
    ("cross-entropy", r"cross_entropy|mean_loss"),
    ("optimizer (AdamW, grad norm, clip)",
     r"adamw|partial_sums|finish_sum|ScaleFn|chunk_squares|finish_squares|multi_scale"),
    ("GELU", r"Gelu"),
]


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return "other (adds, fills, embedding, sort)"


def read_rows(path):
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if header is None:
        sys.exit(f"{path}: no ncu CSV header (a line starting with \"ID\")")
    return [r for r in csv.DictReader(lines[header:])
            if r.get("Metric Name") == "gpu__time_duration.sum"]


def milliseconds(row):
    value = float(row["Metric Value"].replace(",", ""))
    scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0,
             "msecond": 1.0}.get(row["Metric Unit"])
    if scale is None:
        sys.exit(f"unknown unit {row['Metric Unit']!r}")
    return value * scale


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--steps", type=int, default=2, help="training steps the CSV covers")
    p.add_argument("--top", type=int, default=0, help="also list the N costliest kernels")
    a = p.parse_args()
    rows = read_rows(a.csv)
    time, launches = collections.defaultdict(float), collections.Counter()
    by_name = collections.defaultdict(float)
    for r in rows:
        ms = milliseconds(r)
        kind = kind_of(r["Kernel Name"])
        time[kind] += ms
        launches[kind] += 1
        by_name[re.sub(r"\(.*$", "", r["Kernel Name"])] += ms
    total = sum(time.values())
    print(f"{len(rows)} kernels, {total / a.steps:.1f} ms of GPU time per step ({a.steps} steps)\n")
    print("| Kernels | Launches per step | ms per step | Share |")
    print("|---|---|---|---|")
    for kind, ms in sorted(time.items(), key=lambda kv: -kv[1]):
        print(f"| {kind} | {launches[kind] / a.steps:.0f} | {ms / a.steps:.1f} | "
              f"{100 * ms / total:.0f}% |")
    if a.top:
        print()
        for name, ms in sorted(by_name.items(), key=lambda kv: -kv[1])[:a.top]:
            print(f"{ms / a.steps:8.3f} ms/step  {name[:110]}")


if __name__ == "__main__":
    main()
