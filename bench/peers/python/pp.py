"""Pipeline parallelism with torch.distributed.pipelining over gloo, 2 ranks, the batch
(--batch, samples 0 .. batch-1 on every rank) split into 4 micro-batches: the run equals
single.py at the same --batch.

    torchrun --nproc-per-node 2 pp.py --variant V
      gpipe, 1f1b           two stages: (wte, wpe, first half of the blocks | second half,
                            ln_f, head), one per rank
      interleaved1f1b, loopedbfs, interleavedzb
                            four stages S0 = embeddings, S1 = first half of the blocks,
                            S2 = second half, S3 = ln_f + head; rank r holds S[r] and S[r+2]
      zbv, dualpipev        the same four stages in a V: rank 0 holds S0 and S3, rank 1 S1, S2

The head is tied to wte, and the two live on different stages: the embedding stage keeps wte,
the head stage its own copy, and after each backward the two gradients are summed over the
ranks and given to both (as Megatron does), so the copies stay equal. --layers must be even;
bench/parallelism/vs_peers.sh runs --layers 2 (one block per half), as the published table.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pipelining
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import make_model  # noqa: E402
from harness import adamw, finish_gloo, init_gloo, parse_args, report, timed_steps  # noqa: E402

MICRO_BATCHES = 4
SCHEDULES = {
    "gpipe": pipelining.ScheduleGPipe,
    "1f1b": pipelining.Schedule1F1B,
    "interleaved1f1b": pipelining.ScheduleInterleaved1F1B,
    "loopedbfs": pipelining.ScheduleLoopedBFS,
    "interleavedzb": pipelining.ScheduleInterleavedZeroBubble,
    "zbv": pipelining.ScheduleZBVZeroBubble,
    "dualpipev": pipelining.ScheduleDualPipeV,
}


class EmbeddingStage(nn.Module):
    """Token and position embeddings, then `blocks`. Shares its modules with the full model."""

    def __init__(self, full, blocks):
        super().__init__()
        self.wte, self.wpe, self.h = full.wte, full.wpe, nn.ModuleList(blocks)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return x


class BlocksStage(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.h = nn.ModuleList(blocks)

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return x


class HeadStage(nn.Module):
    """`blocks`, ln_f and the head, whose weight starts as a copy of wte's (see the module doc)."""

    def __init__(self, full, blocks):
        super().__init__()
        self.h, self.ln_f = nn.ModuleList(blocks), full.ln_f
        self.head_w = nn.Parameter(full.wte.weight.detach().clone())

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.head_w)


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


a = parse_args(default_variant="gpipe")
if a.variant not in SCHEDULES:
    sys.exit(f"pp.py: unknown --variant {a.variant!r}; one of {', '.join(SCHEDULES)}")
if a.cfg.layers < 2 or a.cfg.layers % 2:
    sys.exit(f"pp.py: --layers must be even (each half of the blocks is a stage), got {a.cfg.layers}")
rank, world = init_gloo()
full = make_model(a.cfg)  # the same initial weights on every rank; each keeps its stages' part
first_half, second_half = list(full.h[:a.cfg.layers // 2]), list(full.h[a.cfg.layers // 2:])
if a.variant in ("gpipe", "1f1b"):
    n_stages = 2
    builders = {0: lambda: EmbeddingStage(full, first_half), 1: lambda: HeadStage(full, second_half)}
    mine = [rank]
else:
    n_stages = 4
    builders = {0: lambda: EmbeddingStage(full, []), 1: lambda: BlocksStage(first_half),
                2: lambda: BlocksStage(second_half), 3: lambda: HeadStage(full, [])}
    mine = [[0, 3], [1, 2]][rank] if a.variant in ("zbv", "dualpipev") else [rank, rank + 2]
modules = {i: builders[i]() for i in mine}
stages = [pipelining.PipelineStage(modules[i], i, n_stages, torch.device("cpu")) for i in mine]
Schedule = SCHEDULES[a.variant]
if n_stages == 2:
    schedule = Schedule(stages[0], MICRO_BATCHES, loss_fn=loss_fn)
else:
    schedule = Schedule(stages, MICRO_BATCHES, loss_fn=loss_fn)
opt = adamw([p for m in modules.values() for p in m.parameters()], a)
tied = [m.wte.weight for m in modules.values() if isinstance(m, EmbeddingStage)] + \
       [m.head_w for m in modules.values() if isinstance(m, HeadStage)]
has_first, has_last = 0 in mine, n_stages - 1 in mine


def step(x, y):
    """Returns the last stage's micro-batch losses (an empty list on other ranks)."""
    opt.zero_grad(set_to_none=True)
    micro_losses = []
    schedule.step(*((x,) if has_first else ()),
                  **(dict(target=y, losses=micro_losses) if has_last else {}))
    grad = torch.zeros_like(full.wte.weight)  # every rank joins the sum, holder or not
    for t in tied:
        if t.grad is not None:
            grad += t.grad
    dist.all_reduce(grad)
    for t in tied:
        t.grad = grad.clone()
    opt.step()
    return micro_losses


def record(s, micro_losses):
    loss = torch.stack(micro_losses).mean().detach() if has_last else torch.zeros(())
    dist.all_reduce(loss)  # the last stage's rank alone contributes
    return loss.item()


step_ms, losses = timed_steps(a, 0, step, record)
report("pp", a, rank, world, step_ms, losses, dict(stages=mine, n_microbatches=MICRO_BATCHES))
finish_gloo()
