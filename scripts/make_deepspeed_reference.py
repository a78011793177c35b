#!/usr/bin/env python3
"""Writes the DeepSpeed reference that tests/strategies/test_torch_reference.cpp holds Loom's
16-bit weights (ShardingOptions::weights_dtype, train_gpt --weights-dtype bf16) to: DeepSpeed's
bf16 mode under ZeRO stages 1, 2 and 3 on 2 ranks, from the same weights and data as
scripts/make_torch_reference.py (the peers' tiny GPT, seed 0; 8 rows of the peers' LCG data
per rank; AdamW lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on every parameter; no
clipping; 20 steps).

Run it with the peers' venv (bench/peers/python/setup.sh makes /tmp/peers-venv with PyPI
torch==2.15.0 and deepspeed==0.19.8), never in CI, whose test reads the file this writes:

    DS_ACCELERATOR=cpu /tmp/peers-venv/bin/torchrun --nproc-per-node 2 \\
        scripts/make_deepspeed_reference.py

DeepSpeed's bf16 mode casts the module to bf16 (its forward, backward and gradients run in
bf16) and keeps f32 master weights and Adam moments in the ZeRO optimizer. The loss is the
cross-entropy of the bf16 logits widened to f32, as Hugging Face's causal LM loss computes it
(and Loom's cross_entropy for 16-bit logits). Writes tests/data/deepspeed_bf16_reference.json:
each stage's 20 losses (the mean over the two ranks), the versions and this command.
"""
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "bench", "peers", "python"))

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from gpt import GPTConfig, make_model  # noqa: E402
from harness import lcg_batch  # noqa: E402

LAYERS, HEADS, EMBD, CTX, VOCAB = 2, 4, 64, 64, 256
ROWS, STEPS = 8, 20  # rows per rank
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def check_init(model):
    """The weights are those of tests/data/torch_reference_init.safetensors (what Loom reads)."""
    init = load_file(os.path.join(ROOT, "tests", "data", "torch_reference_init.safetensors"))
    for name, p in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        want = init[name].t() if name.endswith(CONV1D) else init[name]
        assert torch.equal(p, want), name


def train(stage, rank, world):
    cfg = GPTConfig(LAYERS, HEADS, EMBD, CTX, VOCAB)
    model = make_model(cfg, seed=0)
    check_init(model)
    zero = {"stage": stage}
    if stage == 3:  # a tiny model: partition every parameter (the default keeps small ones whole)
        zero["stage3_param_persistence_threshold"] = 0
    config = {
        "train_micro_batch_size_per_gpu": ROWS,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                                                  "weight_decay": 0.1, "torch_adam": True}},
        "zero_optimization": zero,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
    }
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config=config)
    losses = []
    for step in range(STEPS):
        x, y = lcg_batch(step, rank * ROWS, ROWS, CTX, VOCAB)
        logits = engine(x)
        assert logits.dtype == torch.bfloat16, logits.dtype
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1))
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    kinds = {"optimizer": type(optimizer).__name__,
             "weights": str(next(engine.module.parameters()).dtype)}
    engine.destroy()
    return losses, kinds


def main():
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, "run with torchrun --nproc-per-node 2"
    runs = {}
    for stage in (1, 2, 3):
        losses, kinds = train(stage, rank, world)
        runs[f"stage_{stage}"] = {"losses": losses, **kinds}
        if rank == 0:
            print(f"stage {stage} ({kinds}):", " ".join(f"{l:.6f}" for l in losses), flush=True)
    if rank == 0:
        out = {
            "what": "DeepSpeed's bf16 mode, ZeRO stages 1-3 on 2 ranks of 8 rows, the peers' tiny "
                    "GPT from tests/data/torch_reference_init.safetensors, 20 steps; losses are "
                    "the mean over the ranks of the f32 cross-entropy of the bf16 logits",
            "config": {"layers": LAYERS, "heads": HEADS, "embd": EMBD, "ctx": CTX, "vocab": VOCAB,
                       "rows_per_rank": ROWS, "ranks": world, "steps": STEPS, "lr": 1e-3,
                       "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
            "runs": runs,
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
            "python": platform.python_version(),
            "command": "DS_ACCELERATOR=cpu /tmp/peers-venv/bin/torchrun --nproc-per-node 2 "
                       "scripts/make_deepspeed_reference.py",
        }
        with open(os.path.join(ROOT, "tests", "data", "deepspeed_bf16_reference.json"), "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
