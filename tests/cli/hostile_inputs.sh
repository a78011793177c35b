#!/usr/bin/env bash
# What a hostile user found (issue 42), each now refused or bounded, with one line naming it:
#   - --save and --trace given an existing FIFO or device: refused, and the node is still there
#     (outputs are renamed into place, which would have replaced it);
#   - --data given a FIFO with no writer, or /dev/zero: refused at once, not a hang or an
#     endless read; loom-trace analyze given a FIFO as a dump: the same;
#   - RANK without WORLD_SIZE: refused naming WORLD_SIZE, not a silent run as one rank;
#   - a 16-mixed run whose steps were (mostly) all skipped by the loss scaler: exit 1 naming
#     it; so is a static fp16 loss_scale of 1e300 (DeepSpeed config) that skips every step;
#   - --wrap-policy naming a class the model lacks: refused naming the classes it has;
#   - LOOM_FLIGHT_RECORDER_DIR that cannot be written: refused when the group is made;
#   - a SIGSTOPped rank of a self-spawned job (ddp_spawn, deepspeed_stage_3 --devices 2) with
#     --timeout 3: the job ends within the timeout plus the launcher's grace (5 s), non-zero,
#     with no process left.
#   hostile_inputs.sh TRAIN_GPT LOOM_TRACE
set -euo pipefail
T=$1; TRACE=$2
d=$(mktemp -d)
trap 'pkill -9 -f "$d/" 2> /dev/null || true; rm -rf "$d"' EXIT
M=(--layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 --steps 2 --log-interval 100)
refused() {  # pattern, then the command (bounded by 20 s: a hang is a failure)
  local pattern=$1; shift
  set +e
  timeout 20 "$@" > "$d/out" 2>&1
  local rc=$?
  set -e
  [ "$rc" -ne 124 ] || { echo "hung (killed after 20 s): $*"; cat "$d/out"; exit 1; }
  [ "$rc" -ne 0 ] || { echo "accepted: $*"; cat "$d/out"; exit 1; }
  [ "$rc" -lt 128 ] || { echo "crashed (exit $rc): $*"; cat "$d/out"; exit 1; }
  grep -q -- "$pattern" "$d/out" || { echo "expected '$pattern', got:"; cat "$d/out"; exit 1; }
  echo "refused: $pattern"
}

mkfifo "$d/fifo"
refused "\-\-save $d/fifo exists and is a FIFO" "$T" "${M[@]}" --save "$d/fifo"
refused "\-\-trace $d/fifo exists and is a FIFO" "$T" "${M[@]}" --trace "$d/fifo"
[ -p "$d/fifo" ] || { echo "the FIFO was replaced"; exit 1; }
if mknod "$d/full" c 1 7 2> /dev/null; then  # a private /dev/full (root only)
  refused "\-\-save $d/full exists and is a character device" "$T" "${M[@]}" --save "$d/full"
  [ -c "$d/full" ] || { echo "the device node was replaced"; exit 1; }
fi
refused "$d/fifo: is not a regular file" "$T" "${M[@]}" --data "$d/fifo"
refused "/dev/zero: is not a regular file" "$T" "${M[@]}" --data /dev/zero
mkdir "$d/dumps"; mkfifo "$d/dumps/flight.rank-0.json"
refused "flight.rank-0.json: is not a regular file" "$TRACE" analyze "$d/dumps"

refused "RANK='1' is set but WORLD_SIZE is not" env RANK=1 "$T" "${M[@]}" --strategy ddp
refused "WORLD_SIZE='2' is set but RANK is not" env WORLD_SIZE=2 "$T" "${M[@]}" --strategy ddp

refused "of the 30 steps were skipped by the loss scaler" \
  "$T" --layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 --steps 30 --precision 16-mixed --lr 1e6
cat > "$d/static_scale.json" << 'JSON'
{"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": true, "loss_scale": 1e300},
 "zero_optimization": {"stage": 1}}
JSON
refused "3 of the 3 steps were skipped by the loss scaler" \
  "$T" --layers 1 --heads 2 --embd 16 --ctx 16 --steps 3 --devices 1 --deepspeed-config "$d/static_scale.json"

refused "wrap policy 'Blok' names no module class of this model; its classes are .*Block" \
  "$T" "${M[@]}" --strategy fsdp --devices 2 --wrap-policy Blok
echo x > "$d/a-file"
refused "LOOM_FLIGHT_RECORDER_DIR='$d/a-file/dumps' cannot be created" \
  env LOOM_FLIGHT_RECORDER_DIR="$d/a-file/dumps" "$T" "${M[@]}" --strategy ddp_spawn --devices 2

# A stopped rank: the job must end within --timeout 3 plus the 5 s grace (and some slack for
# this machine), non-zero, naming a timeout, leaving no process behind.
for strategy in ddp_spawn deepspeed_stage_3; do
  # The previous run's log says "step 2/" too: gone before the wait below can read it (the
  # background job truncates it only when it starts).
  rm -f "$d/stopped.log"
  "$T" --layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 --steps 1000000 --log-interval 1 \
    --strategy "$strategy" --devices 2 --timeout 3 > "$d/stopped.log" 2>&1 &
  job=$!
  # Up to 60 s for the job to start training: under ASan, beside another test on 2 cores, a
  # job once printed nothing in 10 s (the wait ends as soon as step 2 is logged).
  for _ in $(seq 1200); do grep -q "step 2/" "$d/stopped.log" 2> /dev/null && break; sleep 0.05; done
  rank1=$(pgrep -P "$job" | head -1 || true)
  [ -n "$rank1" ] || {
    pkill -9 -P "$job" || true; kill -9 "$job" 2> /dev/null || true  # it would train for ever
    echo "$strategy: no rank 1 found"; cat "$d/stopped.log"; exit 1
  }
  kill -STOP "$rank1"
  stopped_at=$SECONDS
  status=0
  for _ in $(seq 400); do kill -0 "$job" 2> /dev/null || break; sleep 0.05; done
  if kill -0 "$job" 2> /dev/null; then
    kill -9 "$job" "$rank1"; echo "$strategy: still running 20 s after rank 1 was stopped"; exit 1
  fi
  wait "$job" || status=$?
  took=$((SECONDS - stopped_at))
  [ "$status" -ne 0 ] || { echo "$strategy: exited 0 with a stopped rank"; exit 1; }
  sleep 0.5
  if kill -0 "$rank1" 2> /dev/null; then
    kill -9 "$rank1"; echo "$strategy: the stopped rank was left behind"; exit 1
  fi
  echo "$strategy: a stopped rank ends the job in ${took} s (exit $status), nothing left behind"
done
echo "every hostile input was refused or bounded"
