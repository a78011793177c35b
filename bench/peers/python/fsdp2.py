"""FSDP2 (fully_shard) over gloo: each Block a unit, then the root. Data as ddp.py.

    torchrun --nproc-per-node 2 fsdp2.py --variant V [--ckpt DIR]
      full        FULL_SHARD (ZeRO-3): parameters resharded after forward
      noreshard   reshard_after_forward=False (SHARD_GRAD_OP, ZeRO-2-like)
      bf16        MixedPrecisionPolicy: bf16 parameters in compute, fp32 reduction
      hsdp        2-D mesh (replicate = world, shard = 1): HYBRID_SHARD
      offload     CPUOffloadPolicy (unpinned)

--ckpt DIR also saves the sharded state with torch.distributed.checkpoint to DIR and the
gathered full state dict to DIR.full.pt (rank 0), for resharding checks.
"""
import os
import sys

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import make_model  # noqa: E402
from harness import (adamw, finish_gloo, init_gloo, mean_over_ranks, parse_args, plain_step,  # noqa: E402
                     report, timed_steps)

a = parse_args(lambda p: p.add_argument("--ckpt", default=""), default_variant="full")
rank, world = init_gloo()
if a.variant == "hsdp":
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
else:
    mesh = init_device_mesh("cpu", (world,))
options = dict(mesh=mesh, reshard_after_forward=a.variant != "noreshard")
if a.variant == "bf16":
    options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
if a.variant == "offload":
    options["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
model = make_model(a.cfg)
for block in model.h:
    fully_shard(block, **options)
fully_shard(model, **options)
if rank == 0:
    w = model.wte.weight
    print("param0:", type(w).__name__, w.placements, w.to_local().shape, flush=True)
opt = adamw(model.parameters(), a)

step = plain_step(model, opt)

step_ms, losses = timed_steps(a, rank * a.batch, step, lambda s, loss: mean_over_ranks(loss, world))
if a.ckpt:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=a.ckpt)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save(full, a.ckpt + ".full.pt")
report("fsdp2", a, rank, world, step_ms, losses)
finish_gloo()
