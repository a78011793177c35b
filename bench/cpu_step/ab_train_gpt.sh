#!/usr/bin/env bash
# Interleaved A/B of two train_gpt binaries (a tree before and after a change): each round runs
# A then B with the same flags on the built-in data and prints the median ms/step of steps 5 on
# in each (from --metrics), their ratio, the peak of tensors and the last loss, so that a change
# smaller than the host's slow and fast spells shows in the median of the rounds' ratios.
# A benchmark, not a test.
# Usage: bash bench/cpu_step/ab_train_gpt.sh A_TRAIN_GPT B_TRAIN_GPT ROUNDS STEPS "FLAGS"
#   e.g. git worktree add /tmp/before <commit> && (cd /tmp/before && cmake --preset release &&
#        cmake --build --preset release --target train_gpt), then
#        bash bench/cpu_step/ab_train_gpt.sh /tmp/before/build/release/tools/train_gpt/train_gpt \
#          build/release/tools/train_gpt/train_gpt 7 40 \
#          "--layers 4 --heads 4 --embd 128 --ctx 128 --batch 8 --threads 1 --precision bf16-mixed"
set -euo pipefail
(($# == 5)) || { sed -n '7p' "$0" >&2; exit 2; }
A=$1 B=$2 ROUNDS=$3 STEPS=$4 FLAGS=$5
for bin in "$A" "$B"; do [ -x "$bin" ] || { echo "not an executable: $bin" >&2; exit 2; }; done
((STEPS > 5)) || { echo "STEPS must be more than 5 (the median is of steps 5 on)" >&2; exit 2; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
ratios=()
for round in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    bin=$A
    [ "$side" = B ] && bin=$B
    # shellcheck disable=SC2086
    "$bin" $FLAGS --steps "$STEPS" --log-interval 1000 --metrics "$OUT/$side.jsonl" \
      > "$OUT/$side.log" 2>&1 || { echo "$side failed:"; tail -5 "$OUT/$side.log"; exit 1; }
  done
  ratios+=("$(python3 - "$OUT" "$round" <<'PY'
import json, statistics, sys
out, round_ = sys.argv[1], sys.argv[2]
sides = []
for side in "AB":
    rows = [json.loads(line) for line in open(f"{out}/{side}.jsonl")]
    ms = statistics.median(r["ms_per_step"] for r in rows if r["step"] >= 5)
    sides.append((ms, rows[-1]["peak_bytes"] / 2**20, rows[-1]["loss"]))
(a, pa, la), (b, pb, lb) = sides
print(f"round {round_}: A {a:.2f} ms, B {b:.2f} ms, B/A {b / a:.3f}; peak {pa:.1f} / {pb:.1f} MiB; "
      f"last loss {la:.6f} / {lb:.6f}", file=sys.stderr)
print(f"{b / a:.4f}")
PY
)")
done
printf '%s\n' "${ratios[@]}" | python3 -c "import statistics, sys; r = [float(x) for x in sys.stdin]; \
print(f'B/A over {len(r)} rounds: median {statistics.median(r):.3f}, min {min(r):.3f}, max {max(r):.3f}')"
