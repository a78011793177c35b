#!/usr/bin/env bash
# README command 1: install, build, and run the main job: train_gpt on its built-in corpus
# with DDP over 2 processes (ddp_spawn: the program starts its second rank itself).
# Extra arguments go to train_gpt, e.g. scripts/run-main.sh --steps 50.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release
cmake --build --preset release --target train_gpt
exec build/release/tools/train_gpt/train_gpt --strategy ddp_spawn --devices 2 "$@"
