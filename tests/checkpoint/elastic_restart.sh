#!/usr/bin/env bash
# Elastic restart: DDP on 2 ranks under `loomrun --max-restarts 2`, saving every 5 steps with
# --resume auto. Once a checkpoint is committed one rank is killed with SIGKILL; loomrun
# stops the other, restarts the group, the ranks resume from the newest checkpoint, and the
# final weights equal an uninterrupted run's, bitwise.
#   elastic_restart.sh LOOMRUN TRAIN_GPT
set -euo pipefail
L=$1; T=$2
d=$(mktemp -d); trap 'kill -9 $run 2> /dev/null || true; rm -rf "$d"' EXIT
run=0
ARGS=(--strategy ddp --layers 2 --heads 2 --embd 64 --ctx 32 --batch 4 --steps 300 --log-interval 1000)
"$L" --nproc-per-node 2 --master-port 0 "$T" "${ARGS[@]}" --save "$d/straight.st" > "$d/straight.log" 2>&1
"$L" --nproc-per-node 2 --master-port 0 --max-restarts 2 "$T" "${ARGS[@]}" \
  --checkpoint-dir "$d/ck" --save-every 5 --resume auto --save "$d/elastic.st" > "$d/elastic.log" 2>&1 &
run=$!
for _ in $(seq 1 600); do  # wait (up to 60 s) for a committed checkpoint past step 20
  compgen -G "$d/ck/step-0000002*/COMMITTED" > /dev/null && break
  sleep 0.1
done
victim=$(pgrep -P "$run" | tail -n 1)
[ -n "$victim" ] || { echo "no rank to kill (the run already ended?)"; cat "$d/elastic.log"; exit 1; }
kill -9 "$victim"
echo "killed rank process $victim"
wait "$run"
grep -q "resuming from" "$d/elastic.log" || { echo "the group did not resume"; cat "$d/elastic.log"; exit 1; }
grep -h -m 2 "resuming from" "$d/elastic.log"
cmp "$d/straight.st" "$d/elastic.st"
echo "elastic restart: the same weights as the uninterrupted run"
