#!/usr/bin/env python3
"""PyTorch peer for Loom's training-step benchmark (docs/performance.md).

Builds the same GPT-2-style model as Loom's nn::GPT (pre-LayerNorm, tanh GELU, learned
positions, tied embeddings, no dropout, Conv1D [in, out] weights) and times one training
step (forward, backward, gradient clipping at norm 1.0, AdamW step) on the CPU with one
thread, on random tokens (the values do not change the time). Prints one JSON line with
the median ms/step and tokens/s.

    python3 scripts/torch_peer_step.py --layers 4 --heads 4 --embd 128 --ctx 128 --batch 8
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, embd, heads, layers):
        super().__init__()
        self.heads = heads
        self.ln_1 = torch.nn.LayerNorm(embd, eps=1e-5)
        self.ln_2 = torch.nn.LayerNorm(embd, eps=1e-5)
        proj_std = 0.02 / math.sqrt(2 * layers)
        self.c_attn_w = torch.nn.Parameter(torch.randn(embd, 3 * embd) * 0.02)
        self.c_attn_b = torch.nn.Parameter(torch.zeros(3 * embd))
        self.c_proj_w = torch.nn.Parameter(torch.randn(embd, embd) * proj_std)
        self.c_proj_b = torch.nn.Parameter(torch.zeros(embd))
        self.fc_w = torch.nn.Parameter(torch.randn(embd, 4 * embd) * 0.02)
        self.fc_b = torch.nn.Parameter(torch.zeros(4 * embd))
        self.fc_proj_w = torch.nn.Parameter(torch.randn(4 * embd, embd) * proj_std)
        self.fc_proj_b = torch.nn.Parameter(torch.zeros(embd))

    def forward(self, x):
        B, T, C = x.shape
        qkv = torch.addmm(self.c_attn_b, self.ln_1(x).view(-1, C), self.c_attn_w).view(B, T, 3 * C)
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (Debian's 1.13): the explicit masked softmax
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(-1, C)
        x = x + torch.addmm(self.c_proj_b, y, self.c_proj_w).view(B, T, C)
        h = torch.addmm(self.fc_b, self.ln_2(x).view(-1, C), self.fc_w)
        h = F.gelu(h, approximate="tanh")
        return x + torch.addmm(self.fc_proj_b, h, self.fc_proj_w).view(B, T, C)


class GPT(torch.nn.Module):
    def __init__(self, vocab, ctx, layers, heads, embd):
        super().__init__()
        self.wte = torch.nn.Parameter(torch.randn(vocab, embd) * 0.02)
        self.wpe = torch.nn.Parameter(torch.randn(ctx, embd) * 0.02)
        self.h = torch.nn.ModuleList(Block(embd, heads, layers) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(embd, eps=1e-5)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte[idx] + self.wpe[:T]
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20, help="timed steps (after 3 warm-up steps)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ddp", type=int, default=0,
                   help="run DistributedDataParallel over this many processes (gloo backend)")
    args = p.parse_args()
    if args.ddp > 0:
        import torch.multiprocessing as mp
        mp.spawn(ddp_worker, args=(args,), nprocs=args.ddp, join=True)
        return

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(args.vocab, args.ctx, args.layers, args.heads, args.embd)
    ms = median_step_ms(model, args)
    B, T = args.batch, args.ctx
    print(json.dumps({"peer": f"torch {torch.__version__}", "threads": args.threads,
                      "ms_per_step": round(ms, 3), "tokens_per_s": round(B * T / ms * 1e3, 1),
                      "config": vars(args)}))


def median_step_ms(model, args, before_step=lambda: None):
    """Median time of one training step (forward, backward, clipping at 1.0, AdamW with weight
    decay on matrices only) over args.steps steps after 3 warm-up steps."""
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=1e-3, foreach=False)
    B, T = args.batch, args.ctx
    data = torch.randint(0, args.vocab, (B * T * 4 + 1,))
    times = []
    for step in range(args.steps + 3):
        s = (step % 4) * B * T
        x = data[s:s + B * T].view(B, T)
        y = data[s + 1:s + B * T + 1].view(B, T)
        before_step()
        t0 = time.perf_counter()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        t1 = time.perf_counter()
        if step >= 3:
            times.append((t1 - t0) * 1e3)
    return statistics.median(times)


def ddp_worker(rank, args):
    """One rank of PyTorch DDP (gloo, one thread): same model, step and per-rank batch."""
    import os
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=rank, world_size=args.ddp)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        GPT(args.vocab, args.ctx, args.layers, args.heads, args.embd))
    ms = median_step_ms(model, args, before_step=dist.barrier)
    if rank == 0:
        B, T = args.batch, args.ctx
        print(json.dumps({"peer": f"torch {torch.__version__} DDP gloo", "ranks": args.ddp,
                          "threads": args.threads, "ms_per_step": round(ms, 3),
                          "tokens_per_s": round(args.ddp * B * T / ms * 1e3, 1),
                          "config": vars(args)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
