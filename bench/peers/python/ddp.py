"""DistributedDataParallel over gloo: rank r trains samples r*batch .. r*batch+batch-1, so 2
ranks of --batch 8 equal single.py --batch 16.

    torchrun --nproc-per-node 2 ddp.py [--batch 8 ...]
"""
import os
import sys

from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (adamw, finish_gloo, init_gloo, make_peer_model, mean_over_ranks,  # noqa: E402
                     parse_args, plain_step, report, timed_steps)

a = parse_args(models=("gpt2", "llama"))
rank, world = init_gloo()
model = DistributedDataParallel(make_peer_model(a))
opt = adamw(model.parameters(), a)

step = plain_step(model, opt)

step_ms, losses = timed_steps(a, rank * a.batch, step, lambda s, loss: mean_over_ranks(loss, world))
report("ddp", a, rank, world, step_ms, losses)
finish_gloo()
