#!/usr/bin/env bash
# Runs a Python test with the .venv that scripts/install-deps.sh makes (which has tokenizers):
#   with_venv_python.sh PYTHON SCRIPT [ARG...]
# Without that python the test is skipped (77), saying why, except under CI=true, where that
# is a failure. The script itself skips the same way when the python lacks tokenizers.
set -uo pipefail
python=$1
shift
if [ ! -x "$python" ]; then
  echo "no $python: run scripts/install-deps.sh (creates .venv with tokenizers)"
  [ "${CI:-}" = true ] && exit 1
  exit 77
fi
exec "$python" "$@"
