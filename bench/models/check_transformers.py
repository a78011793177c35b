#!/usr/bin/env python3
"""Re-checks, live, that Hugging Face transformers and Loom read each other's model
directories (issue 44, item 2): for GPT-2 and for Llama (GQA, tied and untied), Loom trains a
few steps and saves a directory (single file and shards), transformers loads it and computes
the loss of a batch, and Loom computes the loss of the same batch from the same directory
(--lr 0, one step): equal within 1e-5 relative. Then transformers saves the model with
save_pretrained (sharded) and Loom trains on from that directory.

Needs the peers' venv with transformers (bench/models/setup.sh) and a release build:

    bash bench/models/setup.sh
    /tmp/peers-venv/bin/python bench/models/check_transformers.py [--build build/release]

The files CI reads instead (transformers' own directories and losses) come from
scripts/make_llama_reference.py.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CTX, BATCH = 64, 4


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    return out.stdout


def loom_loss(train_gpt, init, data, tmp):
    metrics = os.path.join(tmp, "m.jsonl")
    run([train_gpt, "--init", init, "--data", data, "--batch", str(BATCH),
         "--steps", "1", "--lr", "0", "--grad-clip", "0", "--metrics", metrics])
    with open(metrics) as f:
        return json.loads(f.readline())["loss"]


def hf_loss(model_dir, data):
    """transformers' loss of block 0 of `data` as train_gpt reads it: the bytes, or with the
    directory's tokenizer (AutoTokenizer) the document-start token and the text's ids."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    if os.path.exists(os.path.join(model_dir, "tokenizer.json")):
        tok = transformers.AutoTokenizer.from_pretrained(model_dir)
        start = tok.convert_tokens_to_ids("<|begin_of_text|>")
        ids = [start] + tok(open(data, encoding="utf-8").read(), add_special_tokens=False,
                            split_special_tokens=True)["input_ids"]
        tokens = torch.tensor(ids[: BATCH * CTX + 1], dtype=torch.long)
    else:
        tokens = torch.tensor(list(open(data, "rb").read()[: BATCH * CTX + 1]), dtype=torch.long)
    x, y = tokens[:-1].view(BATCH, CTX), tokens[1:].view(BATCH, CTX)
    with torch.no_grad():
        logits = model(x).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                             y.reshape(-1)).item(), model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    args = p.parse_args()
    train_gpt = os.path.join(args.build, "tools", "train_gpt", "train_gpt")
    data = os.path.join(ROOT, "README.md")
    cases = {
        "gpt2": ["--model", "gpt2", "--layers", "2", "--heads", "4", "--embd", "128"],
        "llama-gqa": ["--model", "llama", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                      "--embd", "128", "--intermediate", "320"],
        "llama-mqa-tied": ["--model", "llama", "--layers", "2", "--heads", "4", "--kv-heads",
                           "1", "--embd", "128", "--intermediate", "320", "--tie-embeddings"],
        # With a tokenizer: the saved directory carries it and AutoTokenizer loads it.
        "llama-tokenized": ["--model", "llama", "--layers", "2", "--heads", "4", "--kv-heads",
                            "2", "--embd", "128", "--intermediate", "320", "--tokenizer",
                            os.path.join(ROOT, "tests", "data", "tokenizers", "llama3-style",
                                         "tokenizer.json")],
    }
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in cases.items():
            for shard_mb in (None, 1):
                out = os.path.join(tmp, f"{name}-{shard_mb}") + "/"
                save = ["--save", out] + (["--save-shard-mb", str(shard_mb)] if shard_mb else [])
                run([train_gpt, *flags, "--ctx", "64", "--data", data, "--steps", "5", *save])
                index = os.path.exists(os.path.join(out, "model.safetensors.index.json"))
                assert index == bool(shard_mb), f"{out}: sharded {index}, expected {bool(shard_mb)}"
                loom = loom_loss(train_gpt, out, data, tmp)
                hf, model = hf_loss(out, data)
                rel = abs(loom - hf) / abs(hf)
                worst = max(worst, rel)
                print(f"{name:16s} shards {'<=1 MiB' if shard_mb else 'one file':8s} "
                      f"Loom {loom:.7f} transformers {hf:.7f} relative {rel:.1e}")
                assert rel < 1e-5, f"{name}: relative difference {rel:.2e} above 1e-5"
            back = os.path.join(tmp, f"{name}-from-transformers")
            model.save_pretrained(back, max_shard_size="100KB")
            run([train_gpt, "--init", back, "--data", data, "--steps", "3"])
            print(f"{name:16s} save_pretrained (sharded) -> Loom --init: trained 3 steps")
    print(f"largest relative difference: {worst:.1e} (transformers {transformers.__version__}, "
          f"torch {torch.__version__})")


if __name__ == "__main__":
    main()
