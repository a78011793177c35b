"""PyTorch's own profile of the step bench/cpu_step/vs_torch.sh times (docs/performance.md,
"Where the time goes"): the same model and step as bench/peers/python/single.py, one thread,
torch.profiler over steps 5..14, the operators with the most self CPU time.

    OMP_NUM_THREADS=1 /tmp/peers-venv/bin/python bench/cpu_step/torch_profile.py [flags]

The flags are the peers' (bench/peers/python/harness.py), --model llama included.
"""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../peers/python"))
from harness import adamw, lcg_batch, make_peer_model, parse_args  # noqa: E402

a = parse_args(argv=["--layers", "4", "--heads", "4", "--embd", "128", "--ctx", "128",
                    "--batch", "8"] + sys.argv[1:], models=("gpt2", "llama"))
torch.set_num_threads(1)
m = make_peer_model(a)
opt = adamw(m.parameters(), a)


def step(s):
    x, y = lcg_batch(s, 0, a.batch, a.cfg.ctx, a.cfg.vocab)
    opt.zero_grad(set_to_none=True)
    m(x, y).backward()
    opt.step()


for s in range(5):
    step(s)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for s in range(5, 15):
        step(s)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
