#!/usr/bin/env bash
# The peers' venv (/tmp/peers-venv: PyPI torch 2.15, ../shared/peers/setup.sh) plus Hugging
# Face transformers and tokenizers, for bench/models/ and scripts/make_llama_reference.py.
# Never run by CI (torch is 5.7 GB). Idempotent.
set -euo pipefail
V=${PEERS_VENV:-/tmp/peers-venv}
here="$(cd "$(dirname "$0")" && pwd)"
bash "$here/../../../shared/peers/setup.sh"
if ! "$V/bin/python" -c "import transformers, tokenizers" 2>/dev/null; then
  "$V/bin/pip" install -q transformers==5.25.0 tokenizers==0.23.3
fi
