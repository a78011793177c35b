#!/usr/bin/env bash
# Elastic restart: DDP on 2 ranks under `loomrun --max-restarts 2`, saving every 5 steps with
# --resume auto. A rank SIGKILLs itself as soon as the checkpoint of step 20 is committed
# (fault point checkpoint.committed, its 4th hit: train_gpt_faults, Note [Fault points] in
# core/fault_points.h); loomrun stops the other, restarts the group once, the ranks resume
# from step 20 (their hit counts start again, and two more saves do not reach a 4th), and the
# final weights equal an uninterrupted run's, bitwise.
#   elastic_restart.sh LOOMRUN TRAIN_GPT_FAULTS
set -euo pipefail
L=$1; T=$2
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
ARGS=(--strategy ddp --layers 2 --heads 2 --embd 64 --ctx 32 --batch 4 --steps 30 --log-interval 1000)
"$L" --nproc-per-node 2 --master-port 0 "$T" "${ARGS[@]}" --save "$d/straight.st" > "$d/straight.log" 2>&1
LOOM_TEST_FAULT=checkpoint.committed:4:crash "$L" --nproc-per-node 2 --master-port 0 --max-restarts 2 \
  "$T" "${ARGS[@]}" --checkpoint-dir "$d/ck" --save-every 5 --resume auto --save "$d/elastic.st" \
  > "$d/elastic.log" 2>&1 || { echo "the elastic run failed"; cat "$d/elastic.log"; exit 1; }
for expected in "was killed by signal 9" "restarting (attempt 2 of 3)" "resuming from .*/step-00000020 "; do
  grep -q "$expected" "$d/elastic.log" || { echo "the log lacks '$expected'"; cat "$d/elastic.log"; exit 1; }
done
cat "$d/elastic.log"
cmp "$d/straight.st" "$d/elastic.st"
echo "elastic restart: the same weights as the uninterrupted run"
