"""train_gpt against PyTorch eager from the same weights and the same tokens: the losses of
every step, and whether they agree within a relative tolerance (issue 46 item 7: GPT-2 small,
bf16-mixed, 50 steps, within 2% at every step; docs/cuda.md, "Verification on a GPU").

    python3 scripts/gpu_loss_parity.py --train-gpt PATH [--device cuda] [--steps 50]
        [--tolerance 0.02] [--layers 12 --heads 12 --embd 768 --ctx 1024 --vocab 50304]
        [--batch 8] [--precision bf16-mixed] [--workdir DIR]

The PyTorch side is the peers' GPT-2 (bench/peers/python/gpt.py, the model Loom's GPT builds,
initialised from seed 0). Its weights go to train_gpt through --init (a .safetensors file in
GPT-2's Conv1D layout, as bench/cpu_step/vs_torch.sh writes it) and both read one llm.c shard
in train_gpt's data order (data/token_blocks.h; train_gpt --data): the bytes of this
repository's docs/*.md as tokens, real text whose loss falls within the 50 steps (random
tokens would keep it flat at log(vocab), where every implementation agrees).
Both train with AdamW (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on the parameters
of two or more dimensions, as train_gpt decays), no clipping, a constant learning rate;
bf16-mixed is torch.autocast on the device, as Lightning's bf16-mixed. Files go to --workdir
(a temporary folder, removed afterwards, by default). Needs torch only: no numpy or
safetensors package. Exit status 0 when every step agrees, 1 when one does not, 2 when a run
fails.
"""
import argparse
import array
import ctypes
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench",
                                "peers", "python"))
from gpt import GPTConfig, make_model  # noqa: E402

# Linear weights PyTorch keeps [out, in] and GPT-2's Conv1D (what --init reads) [in, out].
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def write_safetensors(path, tensors):
    """A .safetensors file of f32 tensors (the format's header: its JSON length as a little-
    endian u64, the JSON, then the data), written to a temporary name and renamed."""
    header, offset = {}, 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for t in tensors.values():
            f.write(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    os.replace(path + ".tmp", path)


def write_token_shard(path, tokens):
    """An llm.c GPT-2 shard: 256 int32 of header (magic 20240520, version 1, count), then the
    tokens as uint16."""
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, tokens.numel(), *([0] * 253)))
        f.write(array.array("H", tokens.tolist()).tobytes())
    os.replace(path + ".tmp", path)


def docs_as_byte_tokens(most):
    """The bytes of docs/*.md (sorted by name) as tokens, at most `most` of them."""
    docs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs")
    text = b"".join(open(os.path.join(docs, name), "rb").read()
                    for name in sorted(os.listdir(docs)) if name.endswith(".md"))
    return torch.tensor(list(text[:most]), dtype=torch.int64)


def block(tokens, step, batch, ctx):
    """train_gpt's batch of step `step` on one process: block step mod blocks of batch * ctx
    tokens; targets the inputs shifted by one (bench/peers/python/harness.py, block_batch)."""
    count = batch * ctx
    start = (step % ((tokens.numel() - 1) // count)) * count
    seq = tokens[start:start + count + 1]
    return seq[:-1].view(batch, ctx), seq[1:].view(batch, ctx)


def torch_losses(model, tokens, a):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    losses = []
    for step in range(a.steps):
        x, y = (t.to(a.device) for t in block(tokens, step, a.batch, a.ctx))
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.precision == "bf16-mixed"):
            loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def loom_losses(a, init, shard, workdir):
    metrics = os.path.join(workdir, "train_gpt_metrics.jsonl")
    command = [a.train_gpt, "--device", a.device, "--layers", str(a.layers), "--heads",
               str(a.heads), "--embd", str(a.embd), "--ctx", str(a.ctx), "--vocab", str(a.vocab),
               "--batch", str(a.batch), "--precision", a.precision, "--init", init, "--data",
               shard, "--steps", str(a.steps), "--lr", "1e-3", "--beta1", "0.9", "--beta2",
               "0.95", "--eps", "1e-8", "--weight-decay", "0.1", "--grad-clip", "0",
               "--warmup-steps", "0", "--schedule", "constant", "--log-interval", "10",
               "--metrics", metrics]
    print("$ " + " ".join(command), flush=True)
    if subprocess.run(command).returncode != 0:
        raise SystemExit(2)
    with open(metrics) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    losses = [row["loss"] for row in rows if "loss" in row]
    if len(losses) != a.steps:
        print(f"train_gpt's metrics hold {len(losses)} losses, expected {a.steps}")
        raise SystemExit(2)
    return losses


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train-gpt", required=True, help="the train_gpt program")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--tolerance", type=float, default=0.02, help="relative, at every step")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--precision", choices=("bf16-mixed", "32-true"), default="bf16-mixed")
    p.add_argument("--workdir", default="",
                   help="keep the files here (default: a temporary folder)")
    a = p.parse_args()
    if a.vocab < 256:
        p.error(f"--vocab {a.vocab}: the tokens are bytes, so at least 256")

    with tempfile.TemporaryDirectory(prefix="loom-parity-") as scratch:
        workdir = a.workdir or scratch
        os.makedirs(workdir, exist_ok=True)
        model = make_model(GPTConfig(a.layers, a.heads, a.embd, a.ctx, a.vocab), seed=0)
        init = os.path.join(workdir, "init.safetensors")
        write_safetensors(init, {k: (v.t() if k.endswith(CONV1D) else v).contiguous()
                                 for k, v in model.state_dict().items() if k != "lm_head.weight"})
        tokens = docs_as_byte_tokens(a.steps * a.batch * a.ctx + 1)
        shard = os.path.join(workdir, "tokens.bin")
        write_token_shard(shard, tokens)

        loom = loom_losses(a, init, shard, workdir)
        peer = torch_losses(model.to(a.device), tokens, a)

    worst, worst_step = 0.0, 0
    print(f"{'step':>5} {'train_gpt':>12} {'torch':>12} {'relative':>10}")
    for step, (x, y) in enumerate(zip(loom, peer)):
        relative = abs(x - y) / abs(y) if math.isfinite(x) else math.inf
        if relative > worst or not math.isfinite(relative):
            worst, worst_step = relative, step
        print(f"{step:>5} {x:>12.6f} {y:>12.6f} {relative:>10.2e}")
    verdict = "PASS" if worst <= a.tolerance else "FAIL"
    print(f"loss parity {verdict}: the largest relative difference is {worst:.3e} at step "
          f"{worst_step} (tolerance {a.tolerance}; {a.steps} steps, {a.device}, {a.precision}, "
          f"torch {torch.__version__})")
    raise SystemExit(0 if verdict == "PASS" else 1)


if __name__ == "__main__":
    main()
