"""FSDP1 (FullyShardedDataParallel) over gloo, each Block a unit (ModuleWrapPolicy), flat
parameters with use_orig_params. Data as ddp.py.

    torchrun --nproc-per-node 2 fsdp1.py --variant V
      FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD   the sharding strategy
      FULL_SHARD_bf16       bf16 parameters in compute, fp32 reduction and buffers
      FULL_SHARD_prefetch   backward prefetch (pre), forward prefetch, limit_all_gathers
      HYBRID_SHARD_explicit_pg   HYBRID_SHARD with (shard group, replica group) passed in

On a CPU-only machine FSDP1 needs device_id=cpu (FSDP1_DEVICE_NONE=1 leaves it None to see
it fail), and HYBRID_SHARD with its default groups is wrong: it takes a "node" to be one
rank, so it shards over nothing and never syncs the replicas (its losses leave
single.py's). HYBRID_SHARD_explicit_pg shards over all ranks with one-rank replica groups,
which is correct (README.md, "Pitfalls").
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import Block, make_model  # noqa: E402
from harness import (adamw, finish_gloo, init_gloo, mean_over_ranks, parse_args, plain_step,  # noqa: E402
                     report, timed_steps)

a = parse_args(default_variant="FULL_SHARD")
rank, world = init_gloo()

strategy = a.variant
for suffix in ("_bf16", "_prefetch", "_explicit_pg"):
    strategy = strategy.split(suffix)[0]
options = dict(auto_wrap_policy=ModuleWrapPolicy({Block}), sharding_strategy=ShardingStrategy[strategy],
               device_id=None if os.environ.get("FSDP1_DEVICE_NONE") else torch.device("cpu"),
               use_orig_params=True)
if a.variant.endswith("_bf16"):
    options["mixed_precision"] = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                buffer_dtype=torch.float32)
if a.variant.endswith("_prefetch"):
    options.update(backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True,
                   limit_all_gathers=True)
if a.variant.endswith("_explicit_pg"):
    # new_group is collective: every rank creates every replica group, then keeps its own.
    shard_group = dist.new_group(list(range(world)))
    replica_groups = [dist.new_group([r]) for r in range(world)]
    options["process_group"] = (shard_group, replica_groups[rank])
model = FSDP(make_model(a.cfg), **options)
if rank == 0 and not a.variant.endswith("_explicit_pg"):
    print(model, flush=True)  # the wrapping, for the log
opt = adamw(model.parameters(), a)

step = plain_step(model, opt)

step_ms, losses = timed_steps(a, rank * a.batch, step, lambda s, loss: mean_over_ranks(loss, world))
report("fsdp1", a, rank, world, step_ms, losses)
finish_gloo()
