"""Where single.py's step goes: the median forward, backward and optimizer times (steps 5
on), one thread, eager. Prints one dict; writes no result file.

    python breakdown.py --layers 4 --heads 4 --embd 128 --ctx 128 --batch 8 --steps 25 [--fused]
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import make_model  # noqa: E402
from harness import adamw, lcg_batch, parse_args  # noqa: E402

a = parse_args(lambda p: p.add_argument("--fused", action="store_true",
                                         help="torch's fused AdamW instead of the foreach default"))
torch.set_num_threads(1)
model = make_model(a.cfg)
opt = adamw(model.parameters(), a, **({"fused": True} if a.fused else {}))
phases = {"fwd": [], "bwd": [], "opt": [], "total": []}
for s in range(a.steps):
    x, y = lcg_batch(s, 0, a.batch, a.cfg.ctx, a.cfg.vocab)
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = model(x, y)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    t3 = time.perf_counter()
    for name, seconds in (("fwd", t1 - t0), ("bwd", t2 - t1), ("opt", t3 - t2), ("total", t3 - t0)):
        phases[name].append(seconds * 1e3)
print({k: round(statistics.median(v[5:]), 2) for k, v in phases.items()},
      "fused" if a.fused else "foreach(default)", "loss19", round(loss.item(), 4))
