#!/usr/bin/env bash
# Loom's sharded strategies against DeepSpeed 0.19.8 and PyTorch 2.15 FSDP on this CPU
# (docs/sharding.md, "Against DeepSpeed and FSDP"). Each pair runs interleaved, Loom then
# its peer (bench/peers/python), for ROUNDS rounds; step times are the slowest rank's
# median. Then fio, where it is installed, measures the NVMe directory's disk (without it that
# part is skipped with a message). Not for CI: it needs the peers' venv
# (bench/peers/python/setup.sh, PyPI torch 2.15 + deepspeed, 5.7 GB) and about 20 minutes.
#
#   bash bench/sharding/vs_peers.sh [OUTDIR]     # then: python3 bench/sharding/summarize.py OUTDIR
# Environment: ROUNDS (2), STEPS (12), ONLY=label,label (a subset of the pairs below),
# MODEL_ARGS (the model and batch flags both sides take), NVME_DIR, PEERS_VENV.
#
# Model: parameters dominate (--layers 8 --heads 8 --embd 512, 25 M parameters, fp32),
# context 64, 4 sequences per rank, 2 ranks with one thread each, AdamW.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PEERS=$ROOT/bench/peers/python
OUT=${1:-$ROOT/build/bench-sharding}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-12}
NVME=${NVME_DIR:-$OUT/nvme}
V=${PEERS_VENV:-/tmp/peers-venv}
PERF=$ROOT/build/release/tools/loom_perf/loom-perf
read -r -a MODEL <<< "${MODEL_ARGS:---layers 8 --heads 8 --embd 512 --ctx 64 --batch 4}"

[ -x "$V/bin/torchrun" ] || { echo "no peers venv at $V: run bash $PEERS/setup.sh" >&2; exit 1; }
[ -x "$PERF" ] || { echo "build Loom first (cmake --build --preset release)" >&2; exit 1; }
mkdir -p "$OUT" "$NVME"
OUT=$(cd "$OUT" && pwd) NVME=$(cd "$NVME" && pwd) # absolute: the peers run from $PEERS
export OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu

# label | Loom's loom-perf arguments | the peer's script and arguments
PAIRS=(
  "ddp|--strategy ddp|ddp.py"
  "zero1|--strategy deepspeed_stage_1|ds_zero.py --variant z1"
  "zero2|--strategy deepspeed_stage_2|ds_zero.py --variant z2"
  "zero3|--strategy deepspeed_stage_3|ds_zero.py --variant z3"
  "zero2_offload|--strategy deepspeed_stage_2_offload|ds_zero.py --variant z2_off"
  "zero3_offload|--strategy deepspeed_stage_3_offload|ds_zero.py --variant z3_offparam"
  "zero3_nvme|--strategy deepspeed_stage_3_offload_nvme --nvme-path $NVME --sub-group-size 1000000|ds_zero.py --variant z3_nvme"
  "fsdp2_full|--strategy fsdp --wrap-policy Block|fsdp2.py --variant full"
  "fsdp1_full|--strategy fsdp --wrap-policy Block|fsdp1.py --variant FULL_SHARD"
)
port=29650
for round in $(seq 1 "$ROUNDS"); do
  for pair in "${PAIRS[@]}"; do
    IFS='|' read -r label loom peer <<< "$pair"
    [[ -z "${ONLY:-}" || ",$ONLY," == *",$label,"* ]] || continue
    # shellcheck disable=SC2086
    "$PERF" strategy $loom "${MODEL[@]}" --steps "$STEPS" --warmup 3 --np 2 \
      --json "$OUT/loom_${label}_r$round.json" > "$OUT/loom_${label}_r$round.log" 2>&1 \
      || echo "loom $label failed (see $OUT/loom_${label}_r$round.log)"
    port=$((port + 1))
    # shellcheck disable=SC2086
    (cd "$PEERS" && timeout 900 "$V/bin/torchrun" --nproc-per-node 2 --master-port $port \
      $peer "${MODEL[@]}" --steps "$STEPS" --out "$OUT/peer_${label}_r$round" \
      > "$OUT/peer_${label}_r$round.log" 2>&1) || echo "peer $label failed (see $OUT/peer_${label}_r$round.log)"
    echo "round $round: $label done"
  done
done

# The disk under the NVMe directory: sequential 1 MiB writes and reads, O_DIRECT, io_uring
# (psync where io_uring is refused). Optional: the step times above stand without it.
if command -v fio > /dev/null; then
  for rw in write read; do
    fio --name="nvme-$rw" --directory="$NVME" --rw=$rw --bs=1M --size=512M --direct=1 \
      --ioengine=io_uring --iodepth=8 --output-format=json > "$OUT/fio_$rw.json" 2> /dev/null \
      || fio --name="nvme-$rw" --directory="$NVME" --rw=$rw --bs=1M --size=512M --direct=1 \
           --ioengine=psync --output-format=json > "$OUT/fio_$rw.json" \
      || { echo "fio $rw failed: no disk bandwidth figure" >&2; rm -f "$OUT/fio_$rw.json"; }
  done
  rm -f "$NVME"/nvme-*
else
  rm -f "$OUT"/fio_*.json # a stale figure from an earlier run would pass for this one's
  echo "skipping the disk bandwidth measurement: fio is not installed (apt-get install -y fio)"
fi
{ date -Iseconds; uname -r; lscpu | grep 'Model name'; "$V/bin/python" -c \
  "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__)" \
  2> /dev/null | tail -1; git -C "$ROOT" rev-parse --short HEAD; } > "$OUT/machine.txt"
echo "done: python3 $ROOT/bench/sharding/summarize.py $OUT"
