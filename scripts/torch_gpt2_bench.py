#!/usr/bin/env python3
"""PyTorch peer for train_gpt's GPU benchmark (docs/cuda.md, `--preset gpt2-small`).

The same model as Loom's nn::GPT (nn/gpt.h), written in plain torch: GPT-2 with pre-LayerNorm
blocks (eps 1e-5), tanh GELU, learned positions, the output projection tied to the token
embedding, no dropout, biases everywhere, Hugging Face's Conv1D layout ([in, out] weights).
Initialised like Loom: N(0, 0.02) weights, the residual projections (attn.c_proj, mlp.c_proj)
N(0, 0.02 / sqrt(2 * layers)), zero biases, LayerNorm weight 1.

The same step as train_gpt: forward, mean cross-entropy, backward, clipping the global
gradient norm at 1.0, AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.1 on
parameters with >= 2 dims). Synthetic tokens uniform in [0, vocab) from a fixed seed, 8 blocks
of batch x ctx visited in order; each step copies its block to the device, as train_gpt does.

Precision: `bf16-mixed` is torch.autocast(bfloat16) around forward and loss (master weights,
gradients and optimizer state in f32); `32-true` is plain f32 with TF32 off (as Loom's
cuBLASLt GEMMs). Attention is F.scaled_dot_product_attention(is_causal=True) where torch has it,
else the explicit masked softmax. AdamW is fused on CUDA where torch has it, else foreach.

Prints train_gpt's `steady state` line (the mean over the steps after --warmup, with train_gpt's
FLOP estimate: 6 x parameters + 12 x layers x ctx x embd per token, as nanoGPT) and the peak
memory on its own line.

    python3 scripts/torch_gpt2_bench.py --batch 8 --steps 20                 # GPT-2 small, eager
    python3 scripts/torch_gpt2_bench.py --batch 8 --steps 20 --compile       # torch.compile
    python3 scripts/torch_gpt2_bench.py --device cpu --layers 2 --heads 2 --embd 64 --ctx 32 \\
        --vocab 256 --batch 2 --steps 3 --precision 32-true                  # a smoke test
"""
import argparse
import contextlib
import inspect
import math
import sys
import time

import torch
import torch.nn.functional as F


class Conv1D(torch.nn.Module):
    """Hugging Face GPT-2's linear layer: weight [in, out], y = x @ weight + bias."""

    def __init__(self, n_in, n_out, std):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(n_in, n_out).normal_(0.0, std))
        self.bias = torch.nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, embd, heads, proj_std):
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(embd, 3 * embd, 0.02)
        self.c_proj = Conv1D(embd, embd, proj_std)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0: the explicit masked softmax
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(torch.nn.Module):
    def __init__(self, embd, proj_std):
        super().__init__()
        self.c_fc = Conv1D(embd, 4 * embd, 0.02)
        self.c_proj = Conv1D(4 * embd, embd, proj_std)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(torch.nn.Module):
    def __init__(self, embd, heads, layers):
        super().__init__()
        proj_std = 0.02 / math.sqrt(2.0 * layers)
        self.ln_1 = torch.nn.LayerNorm(embd, eps=1e-5)
        self.attn = CausalSelfAttention(embd, heads, proj_std)
        self.ln_2 = torch.nn.LayerNorm(embd, eps=1e-5)
        self.mlp = MLP(embd, proj_std)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(torch.nn.Module):
    def __init__(self, vocab, ctx, layers, heads, embd):
        super().__init__()
        if embd % heads != 0:
            raise ValueError(f"--heads {heads} does not divide --embd {embd}")
        self.wte = torch.nn.Embedding(vocab, embd)
        self.wpe = torch.nn.Embedding(ctx, embd)
        torch.nn.init.normal_(self.wte.weight, 0.0, 0.02)
        torch.nn.init.normal_(self.wpe.weight, 0.0, 0.02)
        self.h = torch.nn.ModuleList(Block(embd, heads, layers) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(embd, eps=1e-5)

    def forward(self, idx, targets):
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied output projection
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_optimizer(model, args, device):
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    kwargs = dict(lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
    accepted = inspect.signature(torch.optim.AdamW).parameters
    if device.type == "cuda" and "fused" in accepted:
        kwargs["fused"] = True
        kind = "fused"
    elif "foreach" in accepted:
        kwargs["foreach"] = True
        kind = "foreach"
    else:
        kind = "default"
    return torch.optim.AdamW(groups, **kwargs), kind


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--batch", type=int, default=8, help="sequences per step")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps in all")
    p.add_argument("--warmup", type=int, default=2,
                   help="first steps left out of the steady state (train_gpt leaves out 2)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--precision", choices=["bf16-mixed", "32-true"], default="bf16-mixed")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0, help="0 = off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="the device's peak dense TFLOP/s for the MFU figure "
                        "(default: H100/H200 SXM bf16, as train_gpt)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0 = torch's default)")
    p.add_argument("--log-interval", type=int, default=10)
    args = p.parse_args()
    if args.steps <= 0:
        p.error("--steps must be positive")

    if args.compile and not hasattr(torch, "compile"):
        print(f"torch_gpt2_bench: --compile needs torch.compile (torch >= 2.0); this is torch "
              f"{torch.__version__}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_gpt2_bench: --device cuda but torch.cuda.is_available() is False "
              f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})", file=sys.stderr)
        return 1
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" \
        else torch.device("cpu")
    cuda = device.type == "cuda"
    if cuda:
        # Loom's 32-true GEMMs run with TF32 off (kernels/cuda/gemm.cpp); so does this peer.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.ctx, args.layers, args.heads, args.embd).to(device)
    n_params = sum(p.numel() for p in model.parameters())  # the tied wte counted once
    params = list(model.parameters())
    optimizer, opt_kind = make_optimizer(model, args, device)
    step_model = torch.compile(model) if args.compile else model

    B, T = args.batch, args.ctx
    gen = torch.Generator().manual_seed(args.seed)
    tokens = torch.randint(0, args.vocab, (8 * B * T + 1,), generator=gen, dtype=torch.int64)
    if cuda:
        tokens = tokens.pin_memory()
    blocks = (tokens.numel() - 1) // (B * T)

    if args.precision == "bf16-mixed":
        autocast = lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)  # noqa
    else:
        autocast = contextlib.nullcontext

    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    attention = "scaled_dot_product_attention" if hasattr(F, "scaled_dot_product_attention") \
        else "masked softmax"
    print(f"torch_gpt2_bench: torch {torch.__version__}, {name}, {n_params} parameters "
          f"({args.layers} layers, {args.heads} heads, embd {args.embd}, ctx {T}, "
          f"vocab {args.vocab}); batch {B}, {args.precision}, "
          f"{'torch.compile' if args.compile else 'eager'}, {opt_kind} AdamW, {attention}",
          flush=True)

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times_ms, losses = [], []
    for step in range(args.steps):
        s = (step % blocks) * B * T
        sync()
        t0 = time.perf_counter()
        x = tokens[s:s + B * T].view(B, T).to(device, non_blocking=True)
        y = tokens[s + 1:s + B * T + 1].view(B, T).to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = step_model(x, y)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, args.grad_clip)
        optimizer.step()
        sync()
        t1 = time.perf_counter()
        times_ms.append((t1 - t0) * 1e3)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            print(f"torch_gpt2_bench: step {step}: loss is {losses[-1]}", file=sys.stderr)
            return 1
        if step % max(args.log_interval, 1) == 0 or step == args.steps - 1:
            print(f"step {step}: loss {losses[-1]:.4f}, {times_ms[-1]:.2f} ms", flush=True)

    total_ms = sum(times_ms)
    print(f"summary: {args.steps} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"{total_ms / args.steps:.1f} ms/step, {B * T * args.steps / (total_ms / 1e3):.0f} tokens/s")

    # train_gpt's Throughput: the steps after the warm-up (all of them when there are few).
    first = args.warmup if args.steps > args.warmup + 2 else 0
    steady = times_ms[first:]
    steady_ms = sum(steady) / len(steady)
    tokens_per_s = B * T * len(steady) / (sum(steady) / 1e3)
    flops_per_token = 6.0 * n_params + 12.0 * args.layers * args.ctx * args.embd
    tflops = flops_per_token * tokens_per_s / 1e12
    device_str = f"cuda:{device.index}" if cuda else "cpu"
    print(f"steady state (steps {first}-{args.steps - 1}): {steady_ms:.2f} ms/step, "
          f"{tokens_per_s:.0f} tokens/s, {tflops:.1f} TFLOP/s, "
          f"MFU {100.0 * tflops / args.peak_tflops:.1f}% of {args.peak_tflops:.0f} TFLOP/s, "
          f"device {device_str}")
    if cuda:
        mib = 1 << 20
        print(f"peak memory: {torch.cuda.max_memory_allocated(device) / mib:.1f} MiB allocated "
              f"(torch.cuda.max_memory_allocated), "
              f"{torch.cuda.max_memory_reserved(device) / mib:.1f} MiB reserved")
    else:
        print("peak memory: n/a on the CPU (torch.cuda.max_memory_allocated is CUDA only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
