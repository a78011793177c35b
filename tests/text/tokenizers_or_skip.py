"""Imports Hugging Face `tokenizers` for the tests beside it, or ends the test: skipped (77)
without it, failed under CI=true (scripts/install-deps.sh installs it into .venv)."""
import os
import sys

try:
    import tokenizers  # noqa: F401
except ImportError:
    if os.environ.get("CI") == "true":
        print("CI=true but this python has no tokenizers; run scripts/install-deps.sh")
        sys.exit(1)
    print("skipped: no tokenizers in this python; run scripts/install-deps.sh (creates .venv)")
    sys.exit(77)
