#!/usr/bin/env bash
# A stand-in for PyTorch 1.13's torchrun (Debian 12's python3-torch), for machines without a
# torchrun of their own: it accepts only 1.13's spelling of the options the Loom tests use
# (--nproc_per_node, --nnodes, --node_rank, --master_addr, --master_port, --no_python;
# 1.13's argparse knows no --nproc-per-node and stops with its usage line, as this does), and
# starts the ranks with the variables 1.13 hands them (RANK, LOCAL_RANK, WORLD_SIZE,
# LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
# TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS). It serves no
# store of its own (Loom serves its own on MASTER_PORT + 1 under torchrun). Exit status: the
# first failing rank's, else 0.
#   torchrun_1_13.sh --nproc_per_node N --master_port P --no_python PROGRAM [ARG...]
set -uo pipefail
usage() {
  echo "usage: torchrun [--nnodes NNODES] [--node_rank NODE_RANK] [--nproc_per_node NPROC_PER_NODE]" \
       "[--master_addr MASTER_ADDR] [--master_port MASTER_PORT] [--no_python] training_script ..." >&2
  echo "torchrun: error: unrecognized arguments: $1" >&2
  exit 2
}
nproc=1 nnodes=1 node_rank=0 addr=127.0.0.1 port=29500 no_python=0
while [ $# -gt 0 ]; do
  case "$1" in
    --nproc_per_node) nproc=$2; shift 2 ;;
    --nnodes) nnodes=$2; shift 2 ;;
    --node_rank) node_rank=$2; shift 2 ;;
    --master_addr) addr=$2; shift 2 ;;
    --master_port) port=$2; shift 2 ;;
    --no_python) no_python=1; shift ;;
    --*) usage "$1" ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || usage "(no training_script)"
[ "$no_python" -eq 1 ] || { echo "torchrun stand-in: only --no_python is supported" >&2; exit 2; }
world=$((nproc * nnodes))
pids=()
for ((local = 0; local < nproc; ++local)); do
  rank=$((node_rank * nproc + local))
  RANK=$rank LOCAL_RANK=$local WORLD_SIZE=$world LOCAL_WORLD_SIZE=$nproc GROUP_RANK=$node_rank \
    ROLE_RANK=$rank ROLE_WORLD_SIZE=$world MASTER_ADDR=$addr MASTER_PORT=$port \
    TORCHELASTIC_RUN_ID=none TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=0 "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid"; rc=$?
  [ "$status" -ne 0 ] || status=$rc
done
exit "$status"
