#!/usr/bin/env bash
# Issue 44's live checks against Hugging Face, in one command (never in CI: torch is 5.7 GB):
# installs transformers and tokenizers into the peers' venv, then re-checks the reference files
# CI reads (recheck_references.py) and the interoperability of model directories both ways
# (check_transformers.py). Needs a release build (bash scripts/test.sh or cmake --build).
#   bash bench/models/run.sh [--build build/release]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/setup.sh"
python=${PEERS_VENV:-/tmp/peers-venv}/bin/python
"$python" "$here/recheck_references.py"
"$python" "$here/check_transformers.py" "$@"
