"""Tensor parallelism with torch.distributed.tensor.parallel over gloo, a 1-D mesh of all
ranks: in every Block mlp.c_fc is column-parallel and mlp.c_proj row-parallel; everything
else (attention, embeddings, head) is replicated. Every rank trains the same samples
0 .. batch-1, so the run equals single.py at the same --batch. (Loom's --tp also splits
attention and the vocabulary: bench/parallelism/vs_peers.sh compares each side's own TP.)

    torchrun --nproc-per-node 2 tp.py [--variant mlp|mlp_foreach_off]

mlp_foreach_off: AdamW with foreach=False. The result adds replicated_in_sync: whether the
replicated wte is still bitwise equal on every rank after training.
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import make_model  # noqa: E402
from harness import (adamw, finish_gloo, init_gloo, mean_over_ranks, parse_args, plain_step,  # noqa: E402
                     report, timed_steps)

a = parse_args(default_variant="mlp")
rank, world = init_gloo()
mesh = init_device_mesh("cpu", (world,))
model = make_model(a.cfg)
plan = {}
for i in range(a.cfg.layers):
    plan[f"h.{i}.mlp.c_fc"] = ColwiseParallel()
    plan[f"h.{i}.mlp.c_proj"] = RowwiseParallel()
parallelize_module(model, mesh, plan)
if rank == 0:
    w = model.h[0].mlp.c_fc.weight
    print("c_fc.weight:", type(w).__name__, w.placements, w.to_local().shape, flush=True)
opt = adamw(model.parameters(), a, **({"foreach": False} if a.variant.endswith("foreach_off") else {}))

step = plain_step(model, opt)

step_ms, losses = timed_steps(a, 0, step, lambda s, loss: mean_over_ranks(loss, world))
mine = torch.tensor([model.wte.weight.double().sum().item()])
rank0 = mine.clone()
dist.broadcast(rank0, 0)
report("tp", a, rank, world, step_ms, losses, dict(replicated_in_sync=bool(torch.equal(mine, rank0))))
finish_gloo()
