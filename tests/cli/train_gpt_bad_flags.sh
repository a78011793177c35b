#!/usr/bin/env bash
# train_gpt refuses bad flags before any work starts, with one line naming the flag, the
# value and what is accepted, and a non-zero exit (never an abort): numbers out of range,
# a folder where a file is expected, outputs that cannot be written, empty values, models
# too large for this machine, and flags that have no effect in the configuration asked for.
# And a run that diverges (a non-finite loss and gradient norm) stops naming the step.
#   train_gpt_bad_flags.sh TRAIN_GPT
set -euo pipefail
T=$1
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
M=(--layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 --steps 2 --log-interval 100)
expect_error() {  # pattern, then the train_gpt arguments (after the small model's flags)
  local pattern=$1; shift
  expect_error_of_model "$pattern" "${M[@]}" "$@"
}
expect_error_of_model() {  # pattern, then all the train_gpt arguments
  local pattern=$1; shift
  set +e
  "$T" "$@" > "$d/out" 2>&1
  local rc=$?
  set -e
  if [ "$rc" -eq 0 ]; then echo "accepted: $*"; exit 1; fi
  if [ "$rc" -ge 128 ]; then echo "crashed (exit $rc): $*"; cat "$d/out"; exit 1; fi
  grep -q -- "$pattern" "$d/out" || { echo "expected '$pattern', got:"; cat "$d/out"; exit 1; }
  if grep -q "^Summary\|summary:" "$d/out"; then echo "trained before refusing: $*"; exit 1; fi
  echo "refused ($rc): $pattern"
}
expect_error "steps: must be at least 1, got -5" --steps -5
expect_error "steps: must be at least 1, got 0" --steps 0
expect_error "grad-accum: must be at least 1, got 0" --grad-accum 0
expect_error "grad-accum: must be at least 1, got -2" --grad-accum -2
expect_error "bucket-cap-mb: must be above 0, got -1" --bucket-cap-mb -1
expect_error "log-interval: must be at least 1, got 0" --log-interval 0
expect_error "lr: must be at least 0, got -0.1" --lr -0.1
expect_error "eps: must be above 0, got 0" --eps 0
expect_error "beta2: Value 1 not in range" --beta2 1
expect_error "batch: expected a number, got 'eight'" --batch eight
expect_error "is not a regular file (a FIFO, device, socket or directory); expected --data file" --data "$d"
expect_error "init: Path does not exist" --init "$d/none.safetensors"
expect_error "\-\-save $d/no/w.safetensors: the folder $d/no does not exist" --save "$d/no/w.safetensors"
expect_error "\-\-trace $d is a folder" --trace "$d"
expect_error "\-\-metrics $d/no/m.jsonl: the folder $d/no does not exist" --metrics "$d/no/m.jsonl"
expect_error "\-\-checkpoint-dir $d/no/ckpt: the folder $d/no does not exist" --checkpoint-dir "$d/no/ckpt"
expect_error "unknown strategy" --strategy ddpp
expect_error "seed: expected a whole number from 0 to 18446744073709551615, got '18446744073709551616'" --seed 18446744073709551616
expect_error "seed: expected a whole number" --seed -1
expect_error "\-\-save was given an empty value" --save ''
expect_error "\-\-resume was given an empty value" --resume ''
expect_error_of_model "layers: must be at least 1 and at most 4096, got 9999999999999" --layers 9999999999999
expect_error_of_model "f32 weights, more than this machine's" --layers 4096 --embd 65536 --steps 1
expect_error_of_model "logits take .* GiB, more than this machine's" --layers 1 --batch 65536 --ctx 65536 --vocab 65536
expect_error "writing \-\-metrics file '/dev/full' failed at step 1" --metrics /dev/full
expect_error "\-\-nesterov has no effect here: it needs \-\-optimizer sgd" --nesterov
expect_error "\-\-eps has no effect here: it needs \-\-optimizer adamw" --optimizer sgd --eps 1e-6
expect_error "\-\-keep-last has no effect here: it needs \-\-checkpoint-dir" --keep-last 2
expect_error "\-\-bucket-cap-mb has no effect here: it needs a strategy that reads it (ddp, ddp_find_unused_parameters_true, ddp_fork, ddp_spawn); \-\-strategy single_device does not" --bucket-cap-mb 1
expect_error "\-\-powersgd-rank has no effect here: it needs \-\-ddp-comm-hook powersgd" --strategy ddp_spawn --devices 2 --powersgd-rank 2
expect_error "\-\-sequence-parallel has no effect here: it needs \-\-tp 2 or more" --sequence-parallel
expect_error "\-\-micro-batches has no effect here: it needs a strategy that reads it (pipeline); \-\-strategy single_device does not" --micro-batches 2
expect_error "\-\-tp has no effect here: it needs a strategy that reads it (model_parallel, pipeline); \-\-strategy ddp_spawn does not" --strategy ddp_spawn --tp 2
expect_error "\-\-fsdp-sharding-strategy has no effect here: it needs a strategy that reads it (fsdp, fsdp_cpu_offload); \-\-strategy deepspeed_stage_2 does not" --strategy deepspeed_stage_2 --fsdp-sharding-strategy NO_SHARD
expect_error "\-\-pp-chunks has no effect here: it needs \-\-pp-schedule interleaved_1f1b" --pp 2 --pp-chunks 2
expect_error "deepspeed-config\] '$d' is a folder" --deepspeed-config "$d"
expect_error "step 2: the gradient norm is nan (loss -\?nan); training diverged" --lr 1e30
echo "all refused"
