#!/usr/bin/env bash
# Megatron-LM's weak-scaling table (Narayanan et al., "Efficient Large-Scale Language Model
# Training on GPU Clusters Using Megatron-LM", SC21, Table 1: GPT models of 1.7B to 1T
# parameters on 32 to 3,072 A100 GPUs of NVIDIA's Selene) predicted by loom-sim on the
# dgx-a100 preset (docs/simulation.md, "Megatron-LM's table"). Each row runs Loom's own
# strategy for the row's parallelism (ddp, model_parallel --tp, pipeline --pp --tp) with the
# paper's model, GPU count and global batch; the per-GPU TFLOP/s are the paper's formula,
# 96 B s l h^2 (1 + s / 6h + V / 16lh), over the predicted step, beside the paper's figures.
# Assumptions, the same for every row: micro-batch 1, 16-mixed (the paper's fp16), activation
# checkpointing of every block (the paper's full recomputation), the 1F1B schedule.
# Beside each row, loom-sim's peak per rank and whether it fits the device (80 GiB).
# A benchmark, not a test: it prints a Markdown table.
# Usage: bash bench/sim/megatron_table.sh [BUILD_DIR] [MAX_GPUS]   (build/release, 3072)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/release}
max_gpus=${2:-3072}
loom_sim=$build/tools/train_gpt/loom-sim
# params (B), heads, hidden, layers, tp, pp, GPUs, batch, the paper's TFLOP/s per GPU
rows=("1.7 24 2304 24 1 1 32 512 137"
      "3.6 32 3072 30 2 1 64 512 138"
      "7.5 32 4096 36 4 1 128 512 142"
      "18.4 48 6144 40 8 1 256 1024 135"
      "39.1 64 8192 48 8 2 512 1536 138"
      "76.1 80 10240 60 8 4 1024 1792 140"
      "145.6 96 12288 80 8 8 1536 2304 148"
      "310.1 128 16384 96 8 16 1920 2160 155"
      "529.6 128 20480 105 8 35 2520 2520 163"
      "1008.0 160 25600 128 8 64 3072 3072 163")
echo "| parameters | tp | pp | GPUs | batch | loom-sim ms/step | paper's ms/step | loom-sim TFLOP/s per GPU | paper's | error | loom-sim peak per rank | simulated in |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do
  read -r params heads hidden layers tp pp gpus batch paper <<< "$row"
  (( gpus > max_gpus )) && continue
  dp=$(( gpus / (tp * pp) ))
  per_replica=$(( batch / dp ))
  flags=(--layers "$layers" --heads "$heads" --embd "$hidden" --ctx 2048 --vocab 51200
         --precision 16-mixed --activation-checkpointing Block --cluster dgx-a100 --devices 8
         --world-size "$gpus" --json)
  if (( pp > 1 )); then
    flags+=(--pp "$pp" --tp "$tp" --batch "$per_replica" --micro-batches "$per_replica")
  elif (( tp > 1 )); then
    flags+=(--tp "$tp" --batch 1 --grad-accum "$per_replica")
  else
    flags+=(--strategy ddp --batch 1 --grad-accum "$per_replica")
  fi
  start=$(date +%s.%N)
  json=$("$loom_sim" "${flags[@]}")
  took=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f} s')")
  python3 - "$json" "$params" "$layers" "$hidden" "$gpus" "$batch" "$paper" "$tp" "$pp" "$took" <<'PY'
import json, sys
sim = json.loads(sys.argv[1])
params, l, h, gpus, batch, paper, tp, pp, took = sys.argv[2:]
l, h, gpus, batch, paper = int(l), int(h), int(gpus), int(batch), float(paper)
s, V = 2048, 51200
flops = 96 * batch * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
step = sim["ms_per_step"] / 1e3
predicted = flops / step / gpus / 1e12
paper_ms = flops / (paper * 1e12 * gpus) * 1e3
peak = f"{sim['peak_bytes'] / 2**30:.1f} GiB" + ("" if sim["fits_device_memory"] else
                                                 " (over the device's memory)")
print(f"| {params}B | {tp} | {pp} | {gpus} | {batch} | {step * 1e3:,.0f} | {paper_ms:,.0f} | "
      f"{predicted:.1f} | {paper:.0f} | {100 * (predicted - paper) / paper:+.1f}% | {peak} | "
      f"{took} |")
PY
done
