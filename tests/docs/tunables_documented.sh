#!/usr/bin/env bash
# Every LOOM_* environment variable the code reads is in the README's table of tunables, and
# every name in that table is still read somewhere: the table cannot drift from the code.
#   tunables_documented.sh SOURCE_DIR
set -euo pipefail
cd "$1"
read_by_code=$(grep -rhoE '"LOOM_[A-Z0-9_]+"' --include='*.cpp' --include='*.h' \
                 comm kernels nn optim strategies tensor tools | tr -d '"' | sort -u)
in_readme=$(grep -E '^\| `LOOM_' README.md | grep -oE '`LOOM_[A-Z0-9_]+`' | tr -d '`' | sort -u)
missing=$(comm -23 <(echo "$read_by_code") <(echo "$in_readme"))
stale=$(comm -13 <(echo "$read_by_code") <(echo "$in_readme"))
[ -z "$missing" ] || { echo "read by the code but not in README's table: $missing"; exit 1; }
[ -z "$stale" ] || { echo "in README's table but read nowhere: $stale"; exit 1; }
echo "$(echo "$read_by_code" | wc -l) tunables, all documented"
