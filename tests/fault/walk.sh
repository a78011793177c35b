#!/usr/bin/env bash
# Every fault point of the library (LOOM_TEST_FAULT=list, core/fault_points.h), crashed at and
# failed at, during the third of four saves (or the third step's NVMe swap):
#   crash (SIGKILL at the point): the run dies; the newest committed checkpoint passes
#     loom-ckpt verify, is the second step's (the third's once COMMITTED was written), and
#     resuming from it ends in the bytes of the uninterrupted run;
#   eio, enospc (the system call at the point fails): the run stops with exit 1, one line
#     naming the file or swap file and the error; the same checkpoint survives and resumes
#     bitwise.
# nvme.ring is the exception: an error there is not fatal (the swap file falls back to
# pread/pwrite, says so, and the run ends in the same bytes).
# Configurations: single device with full checkpoints; single device, sharded checkpoints
# written asynchronously; ZeRO-3 with NVMe offload (the nvme.* points).
#   walk.sh TRAIN_GPT_FAULTS TRAIN_GPT LOOM_CKPT
set -euo pipefail
F=$1; T=$2; C=$3
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
base=(--layers 1 --heads 2 --embd 16 --ctx 16 --batch 2 --log-interval 100)
mkdir "$d/nvme"
config_args() {  # configuration name -> its flags
  case "$1" in
    full) echo "" ;;
    sharded-async) echo "--checkpoint-format sharded --async-save" ;;
    nvme) echo "--strategy deepspeed_stage_3_offload_nvme --devices 1 --nvme-path $d/nvme" ;;
  esac
}

points=$(LOOM_TEST_FAULT=list "$F")
[ -n "$points" ] || { echo "no fault points listed"; exit 1; }
walked=0 walked_points=""
for config in full sharded-async nvme; do
  read -r -a extra <<< "$(config_args "$config")"
  rm -rf "$d/reference"
  "$T" "${base[@]}" "${extra[@]}" --steps 4 --checkpoint-dir "$d/reference" --save-every 1 \
    --save "$d/$config.reference.st" > "$d/log" 2>&1 ||
    { cat "$d/log"; exit 1; }
  # How often each point is reached in runs of 2 and 4 steps saving after each step: the
  # difference is two steps' worth, the rest is set-up's (the NVMe swap's first writes).
  for steps in 2 4; do
    rm -rf "$d/counted"
    LOOM_TEST_FAULT_COUNTS="$d/$config.counts$steps" "$F" "${base[@]}" "${extra[@]}" --steps $steps \
      --checkpoint-dir "$d/counted" --save-every 1 > "$d/log" 2>&1 || { cat "$d/log"; exit 1; }
  done
  for point in $points; do
    case "$point:$config" in
      nvme.*:nvme | file.*:full | file.*:sharded-async | checkpoint.*:full | checkpoint.*:sharded-async) ;;
      *) continue ;;
    esac
    two=$(awk -v p="$point" '$2 == p { print $3 }' "$d/$config.counts2")
    total=$(awk -v p="$point" '$2 == p { print $3 }' "$d/$config.counts4")
    [ -n "$total" ] && [ -n "$two" ] || { echo "$config: the runs never reached $point"; exit 1; }
    # The first time in the third step or its save (the 2-step run reached it `two` times);
    # nvme.ring once, at set-up.
    if [ "$point" = nvme.ring ]; then
      hit=1
    else
      hit=$((two + 1))
      [ "$total" -gt "$two" ] || { echo "$config: $point is not reached after step 2"; exit 1; }
    fi
    actions=(crash eio)
    case "$point" in file.write | nvme.write) actions+=(enospc) ;; esac
    for action in "${actions[@]}"; do
      what="$config, $point ($hit of $total), $action"
      ck="$d/ck"; rm -rf "$ck" "$d/nvme"/*
      # (In a subshell of its own, whose stderr is dropped: bash reports the SIGKILL there.)
      status=0
      ( LOOM_TEST_FAULT="$point:$hit:$action" "$F" "${base[@]}" "${extra[@]}" --steps 4 \
          --checkpoint-dir "$ck" --save-every 1 > "$d/log" 2>&1; exit $? ) 2> /dev/null || status=$?
      if [ "$point" = nvme.ring ] && [ "$action" != crash ]; then
        [ "$status" -eq 0 ] && grep -q "io_uring is unavailable here" "$d/log" ||
          { echo "$what: expected the pread/pwrite fallback, said and survived"; cat "$d/log"; exit 1; }
      elif [ "$action" = crash ]; then
        [ "$status" -eq 137 ] || { echo "$what: exit $status, expected the SIGKILL's 137"; cat "$d/log"; exit 1; }
      else
        error="Input/output error"; [ "$action" = eio ] || error="No space left on device"
        [ "$status" -eq 1 ] && grep -q "^error: .*$error" "$d/log" ||
          { echo "$what: exit $status, expected 1 and an error line naming '$error'"; cat "$d/log"; exit 1; }
      fi
      # What survived: the newest committed checkpoint, whole, of the step the fault allows.
      resume_from=0
      latest=$(for s in "$ck"/step-*; do if [ -f "$s/COMMITTED" ]; then echo "$s"; fi; done | sort | tail -1)
      if [ "$point" = nvme.ring ]; then
        :  # (a crash there is before training; the fallback run completed)
      else
        want=2; [ "$point" = checkpoint.committed ] && want=3
        case "$point" in nvme.*) want=2 ;; esac
        [ -n "$latest" ] || { echo "$what: no committed checkpoint survived"; ls -la "$ck"; exit 1; }
        [ "$latest" = "$ck/step-0000000$want" ] ||
          { echo "$what: the newest committed checkpoint is $latest, expected step $want"; exit 1; }
        "$C" verify "$latest" > "$d/verify.log" 2>&1 || { echo "$what: $latest fails verify"; cat "$d/verify.log"; exit 1; }
        resume_from=$want
      fi
      "$T" "${base[@]}" "${extra[@]}" --steps 4 --checkpoint-dir "$ck" --resume auto --save "$d/resumed.st" \
        > "$d/resume.log" 2>&1 || { echo "$what: the resume failed"; cat "$d/resume.log"; exit 1; }
      cmp -s "$d/resumed.st" "$d/$config.reference.st" ||
        { echo "$what: resumed from step $resume_from, the weights differ from the uninterrupted run"; exit 1; }
      [ -z "$(ls -A "$d/nvme")" ] || { echo "$what: files left in the NVMe directory"; exit 1; }
      walked=$((walked + 1))
      walked_points="$walked_points $point"
    done
  done
done
for point in $points; do
  [[ " $walked_points " == *" $point "* ]] || { echo "fault point $point was walked in no configuration"; exit 1; }
done
echo "$walked faults at $(echo "$points" | wc -w) points"
echo "every fault point: the last committed checkpoint survives and resumes bitwise"
