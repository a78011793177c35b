#!/usr/bin/env python3
"""Writes the single-process PyTorch reference that tests/strategies/test_torch_reference.cpp
holds Loom's sharded strategies to (issue 9: 2-rank deepspeed_stage_3 and fsdp match
single-process PyTorch at twice the batch within 2e-4 in loss over 20 steps).

Run it with the peers' venv (bench/peers/python/setup.sh makes /tmp/peers-venv with PyPI
torch==2.15.0); never in CI, whose test reads the files this writes:

    /tmp/peers-venv/bin/python scripts/make_torch_reference.py

It builds the peers' GPT (bench/peers/python/gpt.py: pre-LN, tanh GELU, learned positions,
tied wte/head, SDPA causal attention) in the tiny configuration, writes its initial weights
in the Hugging Face GPT-2 layout (Conv1D weights stored [in, out], no lm_head: what Loom's
--init reads) to tests/data/torch_reference_init.safetensors, trains it on one process with
batch 16 of the peers' LCG data for 20 steps with AdamW(lr 1e-3, betas 0.9/0.95, eps 1e-8,
weight decay 0.1 on every parameter), once in f32 and once from the same weights under CPU
autocast to bf16, and writes both runs' 20 losses, the versions and this command to
tests/data/torch_reference_tiny.json.
"""
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "bench", "peers", "python"))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from gpt import GPTConfig, make_model  # noqa: E402
from harness import adamw, lcg_batch  # noqa: E402

LAYERS, HEADS, EMBD, CTX, VOCAB = 2, 4, 64, 64, 256
BATCH, STEPS = 16, 20
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg = GPTConfig(LAYERS, HEADS, EMBD, CTX, VOCAB)
    model = make_model(cfg, seed=0)
    init = {}
    for name, p in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied to wte
        init[name] = (p.t() if name.endswith(CONV1D) else p).contiguous().clone()
    data = os.path.join(ROOT, "tests", "data")
    save_file(init, os.path.join(data, "torch_reference_init.safetensors"),
              metadata={"format": "pt", "loom.heads": str(HEADS)})

    class Args:
        lr, wd = 1e-3, 0.1

    def train(precision):
        torch.manual_seed(0)
        trained = make_model(cfg, seed=0)
        trained.load_state_dict(model.state_dict())
        opt = adamw(trained.parameters(), Args)
        losses = []
        for step in range(STEPS):
            x, y = lcg_batch(step, 0, BATCH, CTX, VOCAB)
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
                loss = trained(x, y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    losses = train("32-true")
    bf16_losses = train("bf16-mixed")
    out = {
        "what": "single-process PyTorch losses of the peers' tiny GPT, batch 16, 20 steps",
        "config": {"layers": LAYERS, "heads": HEADS, "embd": EMBD, "ctx": CTX, "vocab": VOCAB,
                   "batch": BATCH, "steps": STEPS, "lr": 1e-3, "betas": [0.9, 0.95],
                   "eps": 1e-8, "weight_decay": 0.1},
        "data": "sample i of step s: x[0] = (977*s + 131*i + 17) mod 256, "
                "x[t+1] = (5*x[t] + 3) mod 256; inputs x[:-1], targets x[1:]",
        "losses": losses,
        "bf16_mixed": "the same from the same weights with the forward and the loss under "
                      "torch.autocast('cpu', dtype=torch.bfloat16): linear and SDPA in bf16, "
                      "their bf16 results through GELU, f32 where they meet the residual, "
                      "cross-entropy in f32",
        "bf16_mixed_losses": bf16_losses,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": "/tmp/peers-venv/bin/python scripts/make_torch_reference.py",
    }
    with open(os.path.join(data, "torch_reference_tiny.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("losses:", " ".join(f"{l:.6f}" for l in losses))
    print("bf16-mixed losses:", " ".join(f"{l:.6f}" for l in bf16_losses))


if __name__ == "__main__":
    main()
