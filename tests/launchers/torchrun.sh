#!/usr/bin/env bash
# torchrun --no-python --nproc-per-node 2 train_gpt --strategy ddp: Loom reads torchrun's
# variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) and serves its own store on
# MASTER_PORT + 1, beside torchrun's on MASTER_PORT; only LOOM_STORE_SECRET is exported by
# hand. The model saved is loomrun's bytes. torchrun comes from PyPI's torch, which CI does
# not install (a 5.7 GB wheel): LOOM_TORCHRUN names one, else torchrun on PATH; without
# either the test is skipped (exit 77).
#   torchrun.sh LOOMRUN TRAIN_GPT
set -euo pipefail
LOOMRUN=$1; TRAIN_GPT=$2
torchrun=${LOOM_TORCHRUN:-$(command -v torchrun || true)}
if [ -z "$torchrun" ] || [ ! -x "$torchrun" ]; then
  echo "torchrun not found (set LOOM_TORCHRUN or put PyPI torch's torchrun on PATH): skipped"
  exit 77
fi
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cfg=(--strategy ddp --layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 --steps 3)
LOOM_STORE_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export LOOM_STORE_SECRET
port=$((20000 + $$ % 12000))  # and port + 1; below the ephemeral ports (slurm.sh)
timeout 120 "$torchrun" --no-python --nproc-per-node 2 --master-port "$port" "$TRAIN_GPT" \
  "${cfg[@]}" --save "$d/torchrun.safetensors" > "$d/torchrun.log" 2>&1 ||
  { cat "$d/torchrun.log"; exit 1; }
grep -q "strategy ddp over 2 ranks" "$d/torchrun.log" || { cat "$d/torchrun.log"; exit 1; }
"$LOOMRUN" --nproc-per-node 2 --master-port 0 "$TRAIN_GPT" "${cfg[@]}" \
  --save "$d/loomrun.safetensors" > "$d/loomrun.log" 2>&1 || { cat "$d/loomrun.log"; exit 1; }
cmp "$d/torchrun.safetensors" "$d/loomrun.safetensors"
echo "torchrun starts train_gpt beside its own store and saves loomrun's bytes"
