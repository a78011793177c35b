"""What every peer shares besides the model: the synthetic data, the command line, the
optimizer, the timed step loop and the result each rank writes.

The bench scripts (bench/cpu_step/vs_torch.sh, bench/sharding/vs_peers.sh,
bench/parallelism/vs_peers.sh) and their summaries read the result; its format is a contract:
one line `RESULT {json}` on stdout per rank and, with --out PREFIX, the same json in
PREFIX.rankN.json, with the keys name, variant, rank, world, median_ms_5_19, step_ms, loss
({"0", "10", "19"}), losses, peak_rss_mib, rss_before_model_mib, torch, threads and a peer's
extras. peak_rss_mib is the process's peak resident memory; rss_before_model_mib its resident
memory when parse_args returned (torch imported, the model not yet built), what train_gpt's
"process memory" line subtracts too.
"""
import argparse
import json
import resource
import statistics
import time

import torch
import torch.distributed as dist

from gpt import GPTConfig


def lcg_batch(step, first, n, ctx, vocab=256):
    """Samples first .. first+n-1 of step `step`, as (inputs, targets), each [n, ctx] int64.

    Sample i starts at (977*step + 131*i + 17) mod vocab and continues x -> (5x + 3) mod vocab
    (full period for 256): ctx + 1 tokens, inputs the first ctx, targets the last ctx. Integer
    arithmetic only, so Loom's C++ makes the same tokens. Data-parallel rank r takes samples
    r*batch ..; pipeline and tensor-parallel ranks all take samples 0 .. batch-1."""
    token = (977 * step + 131 * torch.arange(first, first + n) + 17) % vocab
    columns = [token]
    for _ in range(ctx):
        columns.append((5 * columns[-1] + 3) % vocab)
    seq = torch.stack(columns, dim=1)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def parse_args(add_flags=None, default_variant="", argv=None, models=("gpt2",)):
    """The flags every peer takes; `add_flags(parser)` adds a peer's own. An empty --variant
    means default_variant; `models` lists the --model values the peer trains (argparse
    refuses the others). Returns the namespace with `cfg` (a GPTConfig: the shape --layers ..
    --vocab give, for either --model) added."""
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=64)
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch", type=int, default=8,
                   help="rows per rank (data parallel), per pipeline, or per tensor-parallel group")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--wd", type=float, default=0.1, help="AdamW weight decay, on every parameter")
    p.add_argument("--variant", type=str, default="")
    p.add_argument("--out", type=str, default="", help="also write OUT.rankN.json")
    p.add_argument("--model", choices=models, default="gpt2",
                   help="gpt2: gpt.py's GPT; llama: Hugging Face's LlamaForCausalLM (llama.py), "
                        "single and DDP peers only")
    p.add_argument("--kv-heads", type=int, default=2, help="llama: num_key_value_heads")
    p.add_argument("--intermediate", type=int, default=344, help="llama: intermediate_size")
    p.add_argument("--tie-embeddings", action="store_true", help="llama: tie_word_embeddings")
    p.add_argument("--tokens", type=str, default="",
                   help="an llm.c token shard (uint16 GPT-2 ids) read in train_gpt's data order "
                        "(data/token_blocks.h) instead of the LCG samples; single and DDP peers")
    if add_flags:
        add_flags(p)
    a = p.parse_args(argv)
    a.rss_before_model_mib = resident_mib()
    a.variant = a.variant or default_variant
    a.cfg = GPTConfig(a.layers, a.heads, a.embd, a.ctx, a.vocab)
    return a


def make_peer_model(a, seed=0):
    """The model --model names, with its contract's initial weights for `seed`."""
    if a.model == "llama":
        from llama import make_llama
        return make_llama(a, seed)
    from gpt import make_model
    return make_model(a.cfg, seed)


def resident_mib():
    """This process's resident memory now (VmRSS of /proc/self/status), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024.0, 1)
    return float("nan")


def shard_tokens(path):
    """The tokens of an llm.c shard: a header of 256 int32 (magic 20240520, version 1, count),
    then `count` uint16 ids."""
    import numpy as np
    header = np.fromfile(path, dtype=np.int32, count=256)
    if header[0] != 20240520 or header[1] != 1:
        raise SystemExit(f"{path}: not an llm.c GPT-2 shard "
                         f"(magic {header[0]}, version {header[1]})")
    return torch.from_numpy(np.fromfile(path, dtype=np.uint16, offset=1024,
                                        count=int(header[2])).astype(np.int64))


def block_batch(tokens, step, first, n, ctx):
    """train_gpt's block for step `step` of the data-parallel rank whose samples start at
    `first` (rank first // n of the world): block k = step * world + rank starts at
    (k mod blocks) * n * ctx; inputs n rows of ctx tokens, targets the same shifted by one."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    count = n * ctx
    blocks = (tokens.numel() - 1) // count
    start = ((step * world + first // n) % blocks) * count
    seq = tokens[start:start + count + 1]
    return seq[:-1].view(n, ctx).contiguous(), seq[1:].view(n, ctx).contiguous()


def adamw(params, a, **options):
    """The one optimizer: AdamW, betas 0.9/0.95, eps 1e-8, decay on every parameter, no
    clipping anywhere. `options` passes torch's implementation switches (fused, foreach)."""
    return torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.wd,
                             **options)


def plain_step(model, opt):
    """The training step every data-parallel peer takes: zero the gradients, the loss of the
    batch, backward, the optimizer's step. Returns step(x, y) -> loss."""
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        return loss
    return step


def timed_steps(a, first_sample, step, record):
    """Runs a.steps steps. `step(x, y)` does one whole training step (gradients zeroed,
    forward, backward, optimizer) and returns the loss; only it is timed, the batch is made
    before the clock starts. `record(s, loss)` then turns the loss into the figure to log
    (a collective is allowed there: it is outside the time). Returns (step_ms, losses)."""
    step_ms, losses = [], []
    tokens = shard_tokens(a.tokens) if a.tokens else None
    for s in range(a.steps):
        if tokens is not None:
            x, y = block_batch(tokens, s, first_sample, a.batch, a.cfg.ctx)
        else:
            x, y = lcg_batch(s, first_sample, a.batch, a.cfg.ctx, a.cfg.vocab)
        t0 = time.perf_counter()
        loss = step(x, y)
        step_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(record(s, loss))
    return step_ms, losses


def init_gloo():
    """One thread per rank, then the default process group over gloo (torchrun's
    environment). Returns (rank, world)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def finish_gloo():
    # gloo sometimes aborts in its teardown after a run finished; a barrier first avoids most
    # of it. A run is judged by its RESULT line, not its exit code.
    dist.barrier()
    dist.destroy_process_group()


def mean_over_ranks(loss, world):
    """The global batch's loss from each rank's mean (blocks: a collective on every rank)."""
    total = loss.detach().float().clone()
    dist.all_reduce(total)
    return total.item() / world


def report(name, a, rank, world, step_ms, losses, extra=None):
    """Prints this rank's RESULT line and writes it to a.out.rankN.json (see the module doc).
    median_ms_5_19 is the median of every step from step 5 on (steps 5-19 at the default 20
    steps): the first steps carry allocation and compilation."""
    result = dict(name=name, variant=a.variant, rank=rank, world=world,
                  median_ms_5_19=statistics.median(step_ms[5:]) if len(step_ms) > 5 else None,
                  step_ms=[round(ms, 2) for ms in step_ms],
                  loss={k: (losses[k] if k < len(losses) else None) for k in (0, 10, 19)},
                  losses=losses,
                  peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
                  rss_before_model_mib=a.rss_before_model_mib,
                  torch=torch.__version__, threads=torch.get_num_threads())
    result.update(extra or {})
    line = json.dumps(result)
    print("RESULT " + line, flush=True)
    if a.out:
        with open(f"{a.out}.rank{rank}.json", "w") as f:
            f.write(line + "\n")
    return result
