#!/usr/bin/env python3
"""Re-checks, live, the transformers reference files CI reads (issue 44): runs
scripts/make_llama_reference.py and scripts/make_generation_reference.py into a temporary
directory with this machine's transformers and torch and compares what they write with the
checked-in tests/data files: the losses and logits within 1e-6 relative, the greedy tokens
exactly, the saved weights to the bit. A difference means the reference moved (a new
transformers or torch); regenerate the files and look at why.

    bash bench/models/setup.sh
    /tmp/peers-venv/bin/python bench/models/recheck_references.py
"""
import json
import math
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
NUMBERS = ("losses", "probe_logits_first_row", "probe_logits_sum", "probe_logits_abs_sum",
           "gpt2_probe_logits_first_row", "gpt2_probe_logits_abs_sum")


def close(a, b):
    a = a if isinstance(a, list) else [a]
    b = b if isinstance(b, list) else [b]
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-7)
                                    for x, y in zip(a, b))


def main():
    failures = []
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, LOOM_REFERENCE_OUT=out)
        for script in ("make_llama_reference.py", "make_generation_reference.py"):
            subprocess.run([sys.executable, os.path.join(ROOT, "scripts", script)], env=env,
                           check=True, capture_output=True)
        mine = json.load(open(os.path.join(out, "llama_tiny_reference.json")))
        kept = json.load(open(os.path.join(DATA, "llama_tiny_reference.json")))
        for key in NUMBERS:
            ok = close(mine[key], kept[key])
            print(f"llama_tiny_reference.json {key}: {'same' if ok else 'DIFFERENT'}")
            failures += [] if ok else [key]
        mine = json.load(open(os.path.join(out, "generation_reference.json")))
        kept = json.load(open(os.path.join(DATA, "generation_reference.json")))
        for name in ("llama", "gpt2"):
            ok = [c["tokens"] for c in mine[name]] == [c["tokens"] for c in kept[name]]
            print(f"generation_reference.json {name} greedy tokens: {'same' if ok else 'DIFFERENT'}")
            failures += [] if ok else [name]
        for directory in ("llama_tiny", "llama_tiny_sharded", "gpt2_tiny", "llama_tiny_trained",
                          "gpt2_tiny_trained"):
            for file in sorted(os.listdir(os.path.join(DATA, directory))):
                if not file.endswith(".safetensors"):
                    continue
                same = open(os.path.join(out, directory, file), "rb").read() == \
                    open(os.path.join(DATA, directory, file), "rb").read()
                print(f"{directory}/{file}: {'same bytes' if same else 'DIFFERENT'}")
                failures += [] if same else [f"{directory}/{file}"]
    if failures:
        sys.exit(f"the references moved: {', '.join(failures)}")
    print("the checked-in references hold")


if __name__ == "__main__":
    main()
