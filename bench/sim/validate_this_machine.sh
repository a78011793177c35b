#!/usr/bin/env bash
# loom-sim against measured train_gpt steps on this machine (docs/simulation.md,
# "Validation"): for each strategy and model size, the median ms/step of steps 3 and later of
# a real run (rank 0's --metrics) beside loom-sim's prediction on the this-machine preset, and
# the error. A benchmark, not a test: it prints a Markdown table.
#
# The host's fast and slow spells move one run by up to 25% within minutes, so every
# configuration is measured ROUNDS times, the rounds interleaved (round 1 of every
# configuration, then round 2, ...): the table's measurement is the median of the rounds, and
# its spread (the rounds' lowest and highest) is printed beside it.
#
# With --calibrate, each round first calibrates the machine (scripts/calibrate-this-machine.sh
# into a file of the round's own) and predicts from that calibration (loom-sim --cluster
# FILE), so a prediction and its measurement come from the same minutes of the host; the
# table's prediction is then the median of the rounds'. Without it, every prediction is the
# compiled-in this-machine preset's, calibrated whenever it was.
# Usage: bash bench/sim/validate_this_machine.sh [--calibrate] [BUILD_DIR] [STEPS] [ROUNDS]
#        (defaults: build/release, 12, 3)
set -euo pipefail
cd "$(dirname "$0")/../.."
calibrate=false
if [[ ${1:-} == --calibrate ]]; then
  calibrate=true
  shift
fi
build=${1:-build/release}
steps=${2:-12}
rounds=${3:-3}
train_gpt=$build/tools/train_gpt/train_gpt
loom_sim=$build/tools/train_gpt/loom-sim
for program in "$train_gpt" "$loom_sim"; do
  [[ -x $program ]] || { echo "validate_this_machine: $program is missing; build first" >&2; exit 1; }
done
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

# One real run of configuration $1 (an index into sizes x configs); appends its median ms/step
# to $work/measured.$1.
measure() {
  local case=$1 size=${sizes[$(($1 / ${#configs[@]}))]} config=${configs[$(($1 % ${#configs[@]}))]}
  local strategy ranks extra
  read -r strategy ranks extra <<< "$config"
  # The sharded strategies start their own ranks under loomrun's names; ddp_spawn as ddp.
  local launch=("$train_gpt")
  if [[ $strategy != single_device && $strategy != ddp_spawn ]]; then
    launch=("$build/tools/loomrun/loomrun" --nproc-per-node "$ranks" "$train_gpt")
  fi
  rm -f "$work/m.jsonl"
  # shellcheck disable=SC2086
  "${launch[@]}" --strategy "$strategy" --devices "$ranks" $size ${extra:-} --steps "$steps" \
    --metrics "$work/m.jsonl" > "$work/run.log" 2>&1 || { cat "$work/run.log" >&2; exit 1; }
  python3 -c "
import json, statistics
rows = [json.loads(l) for l in open('$work/m.jsonl')]
print(statistics.median(r['ms_per_step'] for r in rows if r['step'] >= 3))" >> "$work/measured.$case"
}

cases=$((${#sizes[@]} * ${#configs[@]}))
for ((round = 1; round <= rounds; ++round)); do
  echo "validate_this_machine: round $round of $rounds ($(date -u +%H:%M:%S) UTC)" >&2
  if $calibrate; then
    bash scripts/calibrate-this-machine.sh --out "$work/cluster.$round.json" "$build" 2> "$work/calibrate.log" ||
      { cat "$work/calibrate.log" >&2; exit 1; }
  fi
  for ((case = 0; case < cases; ++case)); do measure "$case"; done
done
clusters=(this-machine)
$calibrate && clusters=("$work"/cluster.*.json)

predicted_header="predicted ms/step"
$calibrate && predicted_header="predicted ms/step (median of $rounds calibrations; lowest-highest)"
echo "| model | strategy | ranks | measured ms/step (median of $rounds; lowest-highest) | $predicted_header | error |"
echo "|---|---|---|---|---|---|"
for ((case = 0; case < cases; ++case)); do
  size=${sizes[$((case / ${#configs[@]}))]}
  read -r strategy ranks extra <<< "${configs[$((case % ${#configs[@]}))]}"
  name=$strategy
  [[ $strategy == ddp_spawn ]] && name=ddp
  rm -f "$work/predicted"
  for cluster in "${clusters[@]}"; do
    # shellcheck disable=SC2086
    "$loom_sim" --cluster "$cluster" --strategy "$name" --devices "$ranks" $size ${extra:-} --json \
      > "$work/sim.json" 2> "$work/sim.log" || { cat "$work/sim.log" >&2; exit 1; }
    python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['ms_per_step'])" \
      "$work/sim.json" >> "$work/predicted"
  done
  python3 - "$work/measured.$case" "$work/predicted" "$size" "$name ${extra:-}" "$ranks" <<'PY'
import statistics, sys
runs = [float(line) for line in open(sys.argv[1])]
predictions = [float(line) for line in open(sys.argv[2])]
measured, predicted = statistics.median(runs), statistics.median(predictions)
spread = f" ({min(predictions):.1f}-{max(predictions):.1f})" if len(predictions) > 1 else ""
model = sys.argv[3].split(" --heads")[0].replace("--", "")
print(f"| {model} | {sys.argv[4].strip()} | {sys.argv[5]} | {measured:.1f} ({min(runs):.1f}-{max(runs):.1f}) "
      f"| {predicted:.1f}{spread} | {100 * (predicted - measured) / measured:+.1f}% |")
PY
done | tee "$work/table.md"
python3 - "$work/table.md" <<'PY'
import sys
errors = [float(line.rsplit("|", 2)[1].strip().rstrip("%")) for line in open(sys.argv[1])]
print(f"\nWithin 10%: {sum(abs(e) <= 10 for e in errors)} of {len(errors)} configurations.")
PY
