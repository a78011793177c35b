#!/usr/bin/env bash
# README command 2 (and what CI runs): install, build everything, run the whole test suite,
# and judge its skips against the ledger (tests/skips/ledger.toml): a skip the ledger does not
# allow on this machine fails the run. Prints how long each part took.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/timed.sh
timed "install-deps" bash scripts/install-deps.sh
timed "release configure+build" bash -c 'cmake --preset release > /dev/null && cmake --build --preset release'
timed "release ctest" ctest --preset release -j2 --output-junit ctest-junit.xml
python3 tests/skips/check_skips.py --junit build/release/ctest-junit.xml --preset release
