#!/usr/bin/env bash
# README command 2 (and what CI runs): install, build everything, run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release
cmake --build --preset release
ctest --preset release -j2
