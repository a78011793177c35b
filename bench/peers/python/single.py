"""Single process: the reference every parallel peer's losses are held to, and the CPU step
time Loom's single_device step is compared with (bench/cpu_step/vs_torch.sh).

    python single.py --layers 4 --heads 4 --embd 128 --ctx 128 --batch 8 --steps 25 \
        [--threads N] [--compile] [--precision bf16-mixed] [--save-init FILE.safetensors]

--precision bf16-mixed runs the forward and the loss under torch.autocast("cpu", bfloat16), as
Lightning's bf16-mixed does (Loom's --precision bf16-mixed).

--save-init writes the initial weights before training: for GPT-2 a .safetensors file (torch's
[out, in] Linear layout, no lm_head: it is wte), which vs_torch.sh transposes for Loom's --init;
for --model llama a Hugging Face model directory (save_pretrained), which Loom's --init reads
as it is.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (adamw, make_peer_model, parse_args, plain_step, report,  # noqa: E402
                     timed_steps)


def flags(p):
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--compile", action="store_true", help="run the model through torch.compile")
    p.add_argument("--save-init", type=str, default="")
    p.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true")


a = parse_args(flags, models=("gpt2", "llama"))
torch.set_num_threads(a.threads)
model = make_peer_model(a)
if a.save_init and a.model == "llama":
    model.model.save_pretrained(a.save_init)  # a Hugging Face model directory
elif a.save_init:
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"},
              a.save_init)
opt = adamw(model.parameters(), a)
forward = torch.compile(model) if a.compile else model
if a.precision == "bf16-mixed":
    compiled = forward

    def forward(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return compiled(x, y)

step = plain_step(forward, opt)

step_ms, losses = timed_steps(a, 0, step, lambda s, loss: loss.item())
report("single-compile" if a.compile else "single-eager", a, 0, 1, step_ms, losses,
       dict(nparam=sum(p.numel() for p in model.parameters()), first_step_ms=round(step_ms[0], 1),
            precision=a.precision))
