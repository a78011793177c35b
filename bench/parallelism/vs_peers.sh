#!/usr/bin/env bash
# Loom's pipeline schedules and tensor parallelism against torch.distributed.pipelining and
# torch.distributed.tensor.parallel (PyTorch 2.15, gloo) on this CPU (docs/parallelism.md,
# "Against PyTorch"). 2 ranks, one thread each; each pair runs interleaved, Loom then its
# peer, for ROUNDS rounds; a run's figure is its slowest rank's median step over steps 5 and
# on. Pipelines: 4 micro-batches, the same placements (GPipe and 1F1B run (embedding, block 0
# | block 1, head) on the two ranks, interleaved 1F1B the four chunks two per rank). Loom's
# zero_bubble (ZB-H1, one chunk per rank) is set against both of PyTorch's zero-bubble
# schedules, which need two chunks per rank (ScheduleInterleavedZeroBubble looped,
# ScheduleZBVZeroBubble in a V); neither is the same schedule, both the peer's best. Tensor
# parallel: Loom splits attention, the MLP and the vocabulary; the peer's script
# (bench/peers/python/tp.py) splits the MLP only. Not for CI: it needs the peers' venv
# (bench/peers/python/setup.sh, PyPI torch 2.15, 5.7 GB).
#
#   bash bench/parallelism/vs_peers.sh [OUTDIR]
# Environment: ROUNDS (3), STEPS (20), MODEL_ARGS (both sides; --layers even, as the peer's
# placements halve the blocks), LABELS (the pairs to run, by label; default all), PEERS_VENV.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PEERS=$ROOT/bench/peers/python
OUT=${1:-$ROOT/build/bench-parallelism}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-20}
V=${PEERS_VENV:-/tmp/peers-venv}
T=$ROOT/build/release/tools/train_gpt/train_gpt
read -r -a MODEL <<< "${MODEL_ARGS:---layers 2 --heads 4 --embd 128 --ctx 128 --batch 8}"

[ -x "$V/bin/torchrun" ] || { echo "no peers venv at $V: run bash $PEERS/setup.sh" >&2; exit 1; }
[ -x "$T" ] || { echo "build Loom first (cmake --build --preset release)" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd) # absolute: the peers run from $PEERS
export OMP_NUM_THREADS=1

# The peer's placements in Loom's layers (the embedding, each block, the head): two stages
# split the blocks in halves, (embedding, first half | second half, head); four chunks are
# the embedding, each half, and the head.
layers=2
for ((i = 0; i < ${#MODEL[@]} - 1; i++)); do
  [ "${MODEL[i]}" = --layers ] && layers=${MODEL[i + 1]}
done
((layers >= 2 && layers % 2 == 0)) || { echo "--layers must be even, got $layers" >&2; exit 2; }
halves=$((layers / 2 + 1)),$((layers / 2 + 1))
chunks=1,$((layers / 2)),$((layers / 2)),1

# label | Loom's train_gpt flags | the peer's script and variant
PAIRS=(
  "gpipe|--pp 2 --micro-batches 4 --pp-schedule gpipe --pp-balance $halves|pp.py --variant gpipe"
  "1f1b|--pp 2 --micro-batches 4 --pp-schedule 1f1b --pp-balance $halves|pp.py --variant 1f1b"
  "interleaved_1f1b|--pp 2 --micro-batches 4 --pp-schedule interleaved_1f1b --pp-chunks 2 --pp-balance $chunks|pp.py --variant interleaved1f1b"
  "zero_bubble_vs_interleavedzb|--pp 2 --micro-batches 4 --pp-schedule zero_bubble --pp-balance $halves|pp.py --variant interleavedzb"
  "zero_bubble_vs_zbv|--pp 2 --micro-batches 4 --pp-schedule zero_bubble --pp-balance $halves|pp.py --variant zbv"
  "tp|--tp 2|tp.py --variant mlp"
)
ALL=()
for pair in "${PAIRS[@]}"; do ALL+=("${pair%%|*}"); done
read -r -a WANTED <<< "${LABELS:-${ALL[*]}}"
wanted() { local w; for w in "${WANTED[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }
port=29750
for round in $(seq 1 "$ROUNDS"); do
  for pair in "${PAIRS[@]}"; do
    IFS='|' read -r label loom peer <<< "$pair"
    wanted "$label" || continue
    # shellcheck disable=SC2086
    "$T" "${MODEL[@]}" $loom --steps "$STEPS" --grad-clip 0 \
      --log-interval 1000 --metrics "$OUT/loom_${label}_r$round.jsonl" \
      > "$OUT/loom_${label}_r$round.log" 2>&1 || echo "loom $label failed (see $OUT/loom_${label}_r$round.log)"
    port=$((port + 1))
    # shellcheck disable=SC2086
    (cd "$PEERS" && timeout 600 "$V/bin/torchrun" --nproc-per-node 2 --master-port $port \
      $peer "${MODEL[@]}" --steps "$STEPS" --out "$OUT/peer_${label}_r$round" \
      > "$OUT/peer_${label}_r$round.log" 2>&1) || echo "peer $label failed (see $OUT/peer_${label}_r$round.log)"
    echo "round $round: $label done"
  done
done
{ date -Iseconds; lscpu | grep 'Model name'; git -C "$ROOT" rev-parse --short HEAD; } > "$OUT/machine.txt"

# Per schedule: Loom's and the peer's medians per round, and the ratio of their medians.
python3 "$ROOT/bench/train_gpt_pairs_summary.py" "$OUT" "$ROUNDS" "${WANTED[@]}"
