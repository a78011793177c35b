#!/usr/bin/env bash
# core/tunables.h declares every LOOM_* environment variable once (README's table is checked
# against it by the test Tunables.ReadmeTableIsTheDeclarations). This check keeps it the only
# place: no other source names a variable by a string literal of its own ("LOOM_X", or
# "LOOM_X=" when writing a rank's environment), and every declaration is used somewhere, so
# the table cannot drift from the code. Tests are exempt: they set variables as users do.
#   tunables_documented.sh SOURCE_DIR
set -euo pipefail
cd "$1"
sources=(comm core data kernels nn optim strategies tensor tools bench examples)
literals=$(grep -rnE '"LOOM_[A-Z0-9_]+[="]' --include='*.cpp' --include='*.h' --include='*.cu' \
             --include='*.cuh' "${sources[@]}" | grep -vE '^core/tunables\.(h|cpp):' || true)
if [ -n "$literals" ]; then
  echo "LOOM_* names outside core/tunables.h; declare the variable there and use its .name:"
  echo "$literals"
  exit 1
fi
declared=$(grep -oE 'inline constexpr Tunable k[A-Za-z0-9]+' core/tunables.h | awk '{print $4}')
unused=""
for name in $declared; do
  grep -rqE "tunables::$name\b" --include='*.cpp' --include='*.h' --include='*.cu' \
    --include='*.cuh' --exclude='tunables.h' --exclude='tunables.cpp' "${sources[@]}" ||
    unused="$unused $name"
done
[ -z "$unused" ] || { echo "declared in core/tunables.h but used nowhere:$unused"; exit 1; }
echo "$(echo "$declared" | wc -w) tunables, each declared once in core/tunables.h"
