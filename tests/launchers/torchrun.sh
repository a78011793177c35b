#!/usr/bin/env bash
# torchrun --no-python, 2 ranks, train_gpt --strategy ddp: Loom reads torchrun's variables
# (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT) and serves its own store on MASTER_PORT + 1,
# beside torchrun's on MASTER_PORT; only LOOM_STORE_SECRET is exported by hand. The model
# saved is loomrun's bytes. Runs under every torchrun at hand:
#   - the machine's own (LOOM_TORCHRUN, else torchrun on PATH: PyPI torch 2.x, or Debian's
#     python3-torch 1.13), if any;
#   - always, tests/launchers/torchrun_1_13.sh, a stand-in that knows only PyTorch 1.13's
#     spelling of the options (--nproc_per_node, --no_python, --master_port).
# The options are spelled as the launcher's --help spells them: 2.x accepts both spellings,
# 1.13 only the underscored one.
#   torchrun.sh LOOMRUN TRAIN_GPT
set -euo pipefail
LOOMRUN=$1; TRAIN_GPT=$2
here=$(cd "$(dirname "$0")" && pwd)
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
cfg=(--strategy ddp --layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 --steps 3)
LOOM_STORE_SECRET=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
export LOOM_STORE_SECRET

"$LOOMRUN" --nproc-per-node 2 --master-port 0 "$TRAIN_GPT" "${cfg[@]}" \
  --save "$d/loomrun.safetensors" > "$d/loomrun.log" 2>&1 || { cat "$d/loomrun.log"; exit 1; }

launchers=("$here/torchrun_1_13.sh")
own=${LOOM_TORCHRUN:-$(command -v torchrun || true)}
if [ -n "$own" ] && [ -x "$own" ]; then
  launchers+=("$own")
else
  echo "no torchrun of this machine's (LOOM_TORCHRUN, PATH): the 1.13 stand-in only"
fi
port=$((20000 + $$ % 12000))  # and port + 1; below the ephemeral ports (slurm.sh)
for launcher in "${launchers[@]}"; do
  if "$launcher" --help 2>&1 | grep -q -- "--nproc-per-node"; then
    spelling=(--nproc-per-node 2 --master-port "$port" --no-python)
  else
    spelling=(--nproc_per_node 2 --master_port "$port" --no_python)
  fi
  log="$d/torchrun.log"
  timeout 120 "$launcher" "${spelling[@]}" "$TRAIN_GPT" "${cfg[@]}" \
    --save "$d/torchrun.safetensors" > "$log" 2>&1 || { cat "$log"; exit 1; }
  grep -q "strategy ddp over 2 ranks" "$log" || { cat "$log"; exit 1; }
  cmp "$d/torchrun.safetensors" "$d/loomrun.safetensors"
  echo "$launcher (${spelling[0]}) starts train_gpt beside its own store and saves loomrun's bytes"
  rm -f "$d/torchrun.safetensors"
  port=$((port + 2))
done
