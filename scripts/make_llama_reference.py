#!/usr/bin/env python3
"""Writes the Hugging Face transformers reference that Loom's Llama is held to (issue 44):
a tiny LlamaForCausalLM (grouped-query attention, untied lm_head), saved by save_pretrained
to tests/data/llama_tiny/ (config.json + model.safetensors: what `train_gpt --init DIR`
reads), trained on one process with batch 16 of the peers' LCG data for 20 steps with
AdamW(lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on every parameter), and its 20
losses, the logits of a fixed input and the versions in tests/data/llama_tiny_reference.json.
The same model saved in shards (max_shard_size 100KB: llama_tiny_sharded/) and a tiny
GPT2LMHeadModel's save_pretrained directory (gpt2_tiny/, with its probe logits in the JSON)
check that Loom reads what transformers writes.

Run it with the peers' venv plus transformers (bench/llama/setup.sh), never in CI, whose tests
read the files this writes:

    /tmp/peers-venv/bin/python scripts/make_llama_reference.py
"""
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "bench", "peers", "python"))
# Where the files go: tests/data, or LOOM_REFERENCE_OUT (bench/models/recheck_references.py
# writes them elsewhere to compare with the checked-in ones).
OUT = os.environ.get("LOOM_REFERENCE_OUT", os.path.join(ROOT, "tests", "data"))

import torch  # noqa: E402
import transformers  # noqa: E402
from harness import lcg_batch  # noqa: E402

CONFIG = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
              rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
              attention_bias=False, mlp_bias=False, hidden_act="silu")
BATCH, STEPS, CTX = 16, 20, 64


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**CONFIG, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(config).float()
    out_dir = os.path.join(OUT, "llama_tiny")
    model.save_pretrained(out_dir, safe_serialization=True)
    for extra in ("generation_config.json",):
        path = os.path.join(out_dir, extra)
        if os.path.exists(path):
            os.remove(path)

    model.save_pretrained(os.path.join(OUT, "llama_tiny_sharded"),
                          safe_serialization=True, max_shard_size="100KB")
    torch.manual_seed(1)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=4,
        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).eval()
    gpt2.save_pretrained(os.path.join(OUT, "gpt2_tiny"), safe_serialization=True)
    for d in ("llama_tiny_sharded", "gpt2_tiny"):
        path = os.path.join(OUT, d, "generation_config.json")
        if os.path.exists(path):
            os.remove(path)

    probe, _ = lcg_batch(1000, 0, 2, 16)
    with torch.no_grad():
        gpt2_logits = gpt2(probe).logits
    with torch.no_grad():
        logits = model(probe).logits  # [2, 16, 256]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    losses = []
    for step in range(STEPS):
        x, y = lcg_batch(step, 0, BATCH, CTX)
        opt.zero_grad(set_to_none=True)
        logits_step = model(x).logits
        loss = torch.nn.functional.cross_entropy(logits_step.reshape(-1, 256), y.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out = {
        "what": "transformers LlamaForCausalLM (tests/data/llama_tiny), single process, "
                "batch 16, 20 steps; logits of the probe before training",
        "config": {"batch": BATCH, "steps": STEPS, "ctx": CTX, "lr": 1e-3, "betas": [0.9, 0.95],
                   "eps": 1e-8, "weight_decay": 0.1},
        "data": "sample i of step s: x[0] = (977*s + 131*i + 17) mod 256, "
                "x[t+1] = (5*x[t] + 3) mod 256; inputs x[:-1], targets x[1:]",
        "probe": "samples 0 and 1 of step 1000 with ctx 16 (the same LCG)",
        "probe_logits_first_row": logits[0, :, :8].reshape(-1).tolist(),
        "probe_logits_sum": float(logits.double().sum()),
        "probe_logits_abs_sum": float(logits.double().abs().sum()),
        "gpt2_probe_logits_first_row": gpt2_logits[0, :, :8].reshape(-1).tolist(),
        "gpt2_probe_logits_abs_sum": float(gpt2_logits.double().abs().sum()),
        "losses": losses,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "command": "/tmp/peers-venv/bin/python scripts/make_llama_reference.py",
    }
    with open(os.path.join(OUT, "llama_tiny_reference.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("losses:", " ".join(f"{l:.6f}" for l in losses))


if __name__ == "__main__":
    main()
