#!/usr/bin/env bash
# The CPU attention kernel before and after the flash rewrite (docs/performance.md), on GPT
# shapes from 0.8M to 124M parameters, 1 and 2 threads. Compiles the kernel of commit OLD
# (default fe6bbf3~1, the last with the [T, T] probabilities) into namespace `old` next to the
# current one, against the release build's libraries.
#
#   bash bench/cpu_step/attention_before_after.sh [OLD]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OLD=${1:-fe6bbf3~1}
B=$ROOT/build/release
[ -f "$B/kernels/libloom_kernels.a" ] || { echo "build Loom first (cmake --build --preset release)" >&2; exit 1; }
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
rename() {  # the old file with its namespace renamed to loom::kernels::cpu::old
  sed 's/namespace loom::kernels::cpu {/namespace loom::kernels::cpu { namespace old {/;
       s/^}  \/\/ namespace loom::kernels::cpu/}}  \/\/ namespace loom::kernels::cpu/;
       s/#include "kernels\/cpu\/attention.h"/#include "old_attention.h"/'
}
git -C "$ROOT" show "$OLD:kernels/cpu/attention.h" | rename > "$d/old_attention.h"
git -C "$ROOT" show "$OLD:kernels/cpu/attention.cpp" | rename > "$d/old_attention.cpp"
g++ -O3 -march=native -fno-math-errno -fno-trapping-math -std=c++20 -I"$ROOT" -I"$d" \
  "$ROOT/bench/cpu_step/attention_before_after.cpp" "$d/old_attention.cpp" \
  "$B/kernels/libloom_kernels.a" "$B/core/libloom_core.a" -ldnnl -lgomp -lpthread -o "$d/before_after"
"$d/before_after"
