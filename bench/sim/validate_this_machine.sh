#!/usr/bin/env bash
# loom-sim against measured train_gpt steps on this machine (docs/simulation.md,
# "Validation"): for each strategy and model size, the median ms/step of steps 3 and later of
# a real run (rank 0's --metrics) beside loom-sim's prediction on the this-machine preset, and
# the error. A benchmark, not a test: it prints a Markdown table.
# Usage: bash bench/sim/validate_this_machine.sh [BUILD_DIR] [STEPS]   (build/release, 12)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/release}
steps=${2:-12}
train_gpt=$build/tools/train_gpt/train_gpt
loom_sim=$build/tools/train_gpt/loom-sim
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sizes=("--layers 4 --embd 128 --heads 4 --ctx 128 --batch 8"
       "--layers 4 --embd 256 --heads 4 --ctx 256 --batch 4")
# strategy, ranks, extra flags
configs=("single_device 1 --threads 1" "ddp_spawn 2" "deepspeed_stage_1 2" "deepspeed_stage_2 2"
         "deepspeed_stage_3 2" "fsdp 2" "fsdp_cpu_offload 2"
         "fsdp 2 --fsdp-sharding-strategy HYBRID_SHARD" "model_parallel 2 --tp 2"
         "pipeline 2 --pp 2 --micro-batches 4"
         "pipeline 2 --pp 2 --micro-batches 4 --pp-schedule gpipe"
         "pipeline 2 --pp 2 --micro-batches 4 --pp-schedule interleaved_1f1b"
         "pipeline 2 --pp 2 --micro-batches 4 --pp-schedule zero_bubble"
         "pipeline 8 --pp 2 --tp 2 --micro-batches 4")
echo "| model | strategy | ranks | measured ms/step | predicted ms/step | error |"
echo "|---|---|---|---|---|---|"
for size in "${sizes[@]}"; do
  for config in "${configs[@]}"; do
    read -r strategy ranks extra <<< "$config"
    # The sharded strategies start their own ranks under loomrun's names; ddp_spawn as ddp.
    launch=("$train_gpt")
    name=$strategy
    if [[ $strategy != single_device && $strategy != ddp_spawn ]]; then
      launch=("$build/tools/loomrun/loomrun" --nproc-per-node "$ranks" "$train_gpt")
    fi
    [[ $strategy == ddp_spawn ]] && name=ddp
    # shellcheck disable=SC2086
    "${launch[@]}" --strategy "$strategy" --devices "$ranks" $size ${extra:-} --steps "$steps" \
      --metrics "$work/m.jsonl" > "$work/run.log" 2>&1 || { cat "$work/run.log" >&2; exit 1; }
    measured=$(python3 -c "
import json, statistics, sys
rows = [json.loads(l) for l in open('$work/m.jsonl')]
print(statistics.median(r['ms_per_step'] for r in rows if r['step'] >= 3))")
    # shellcheck disable=SC2086
    predicted=$("$loom_sim" --strategy "$name" --devices "$ranks" $size ${extra:-} --json |
      python3 -c "import json, sys; print(json.load(sys.stdin)['ms_per_step'])")
    python3 -c "
m, p = $measured, $predicted
print(f'| {\"$size\".split(\" --heads\")[0].replace(\"--\", \"\")} | $name ${extra:-} | $ranks | {m:.1f} | {p:.1f} | {100 * (p - m) / m:+.1f}% |')"
  done
done
