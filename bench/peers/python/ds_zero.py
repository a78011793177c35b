"""DeepSpeed ZeRO on the CPU: DS_ACCELERATOR=cpu, deepspeed.init_distributed over gloo (no
oneCCL). Data as ddp.py; AdamW with harness.py's settings in every variant.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 ds_zero.py --variant V [--ckpt DIR]
      z1, z2, z3      ZeRO stage 1/2/3, fp32, torch.optim.AdamW inside DeepSpeed (torch_adam)
      zN_fused        stage N with DeepSpeed's FusedAdam (its CPU build, compiled on first use)
      zN_off          stage N, optimizer offloaded to the CPU (DeepSpeedCPUAdam, compiled too)
      z3_offparam     stage 3, parameters and optimizer offloaded to the CPU (ZeRO-Infinity)
      z3_nvme         stage 3, parameters and optimizer swapped to /tmp/ds-nvme (libaio-dev)

Stage 3 keeps parameters under stage3_param_persistence_threshold (1e5 elements by default)
whole on every rank, which on a small model is all of them: the threshold is 0 here, so every
parameter is sharded. z3_nvme's settings are the ones its swapper accepts for these models
(README.md, "Pitfalls"); its buffer_size 1e6 is smaller than a width-512 model's largest
parameter, where it fails (docs/sharding.md).
"""
import os
import sys

import deepspeed
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import make_model  # noqa: E402
from harness import finish_gloo, mean_over_ranks, parse_args, report, timed_steps  # noqa: E402

NVME_DIR = "/tmp/ds-nvme"


def ds_config(a):
    """The DeepSpeed config of variant a.variant."""
    v = a.variant
    stage = int(v[1])
    zero = {"stage": stage}
    adam = {"lr": a.lr, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": a.wd}
    if v.endswith("_off") or v == "z3_offparam":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    if v == "z3_offparam":
        zero["offload_param"] = {"device": "cpu", "pin_memory": False}
    if v == "z3_nvme":
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": NVME_DIR, "pin_memory": False}
        zero["offload_param"] = {"device": "nvme", "nvme_path": NVME_DIR, "pin_memory": False,
                                 "buffer_count": 16, "buffer_size": 1e6, "max_in_cpu": 0}
        zero["stage3_max_live_parameters"] = 2e6
        zero["stage3_prefetch_bucket_size"] = 1e6
        zero["sub_group_size"] = 1e6
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    if not (v.endswith("_fused") or "off" in v or "nvme" in v):
        adam["torch_adam"] = True
    cfg = {
        "train_micro_batch_size_per_gpu": a.batch,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": adam},
        "zero_optimization": zero,
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
    }
    if "nvme" in v:
        cfg["aio"] = {"block_size": 1048576, "queue_depth": 8, "single_submit": False,
                      "overlap_events": True, "thread_count": 1}
    return cfg


def build_model(a, cfg, rank):
    if "nvme" not in a.variant or os.environ.get("DS_NO_ZERO_INIT") is not None:
        return make_model(a.cfg)
    # NVMe swapping needs the model built under zero.Init: without it DeepSpeed converts the
    # model with no config and, on the CPU accelerator, the parameter swapper picks bf16
    # ("expected m1 and m2 to have the same dtype" in an fp32 run; DS_NO_ZERO_INIT=1 shows it).
    # zero.Init partitions each parameter as it is made, so the init's draws in GPT.__init__
    # hit shards: copy a plain model's weights in afterwards.
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = make_model(a.cfg)
    reference = dict(make_model(a.cfg).named_parameters())
    for name, p in model.named_parameters():
        with deepspeed.zero.GatheredParameters([p], modifier_rank=0):
            if rank == 0:
                p.data.copy_(reference[name].data)
    return model


def print_nvme_state(model, opt):
    """What the swapper did by step 10: the files under NVME_DIR and where a parameter lives."""
    files = [os.path.join(d, f) for d, _, names in os.walk(NVME_DIR) for f in names]
    print("nvme swap files at step 10:", len(files), "bytes:", sum(os.path.getsize(f) for f in files),
          files[:4], flush=True)
    p0 = next(iter(model.parameters()))
    print("optimizer_swapper:", type(getattr(opt, "optimizer_swapper", None)).__name__,
          "param ds_tensor status/final_location:", getattr(p0.ds_tensor, "status", None),
          getattr(p0.ds_tensor, "final_location", None),
          "nvme_swapper:", type(getattr(p0, "nvme_swapper", None)).__name__, flush=True)


a = parse_args(lambda p: p.add_argument("--ckpt", default=""), default_variant="z1")
torch.set_num_threads(1)
deepspeed.init_distributed(dist_backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
config = ds_config(a)
if "nvme" in a.variant:
    os.makedirs(NVME_DIR, exist_ok=True)
model = build_model(a, config, rank)
engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
if rank == 0:
    print("optimizer:", type(opt).__name__, "basic:", type(getattr(opt, "optimizer", opt)).__name__, flush=True)


def step(x, y):
    loss = engine(x, y)
    engine.backward(loss)
    engine.step()  # also zeroes the gradients
    return loss


def record(s, loss):
    if s == 10 and "nvme" in a.variant and rank == 0:
        print_nvme_state(model, opt)
    return mean_over_ranks(loss, world)


step_ms, losses = timed_steps(a, rank * a.batch, step, record)
if a.ckpt:
    engine.save_checkpoint(a.ckpt, tag="step20")
report("deepspeed", a, rank, world, step_ms, losses, dict(deepspeed=deepspeed.__version__))
finish_gloo()
