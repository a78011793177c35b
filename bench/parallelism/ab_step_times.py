#!/usr/bin/env python3
"""Two train_gpt binaries side by side on the step time of each strategy, interleaved:

    python3 bench/parallelism/ab_step_times.py BASELINE_TRAIN_GPT CANDIDATE_TRAIN_GPT
        [--rounds 5] [--steps 12] [--only NAME,...]

Each round runs every configuration below with both binaries, the baseline first in even
rounds and the candidate first in odd ones (the machine's fast and slow spells fall on both,
and so does the penalty of running second). A run's step time is the median of its
--metrics ms_per_step after the first two steps. Prints per configuration the median over
rounds of each binary's step time and the median of the rounds' candidate / baseline
ratios. Used for issue 43's "no regression" check of the strategies/ redesign (pipeline and
tensor parallelism averaging through DDP's reducer): BASELINE built from c9cca6a.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

SMALL = ["--layers", "2", "--heads", "2", "--embd", "64", "--ctx", "64", "--batch", "4"]
MEDIUM = ["--layers", "4", "--heads", "4", "--embd", "256", "--ctx", "128", "--batch", "4"]
STRATEGIES = {
    "ddp-2": ["--strategy", "ddp_spawn", "--devices", "2"],
    "zero3-2": ["--strategy", "deepspeed_stage_3", "--devices", "2"],
    "pp2-dp2": ["--pp", "2", "--devices", "4", "--micro-batches", "2"],
    "tp2-dp2": ["--tp", "2", "--devices", "4"],
}
CONFIGS = {f"{name}-{size}": flags + model
           for size, model in (("small", SMALL), ("medium", MEDIUM))
           for name, flags in STRATEGIES.items()}


def step_ms(binary: str, flags: list, steps: int, scratch: str) -> float:
    metrics = os.path.join(scratch, "metrics.jsonl")
    subprocess.run([binary, *flags, "--steps", str(steps), "--log-interval", "1000",
                    "--metrics", metrics], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    with open(metrics) as f:
        times = [json.loads(line)["ms_per_step"] for line in f]
    return statistics.median(times[2:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("baseline")
    p.add_argument("candidate")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--only", default="", help="comma-separated configuration names")
    args = p.parse_args()
    names = [n for n in CONFIGS if not args.only or n in args.only.split(",")]
    times = {n: {"baseline": [], "candidate": []} for n in names}
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(args.rounds):
            order = ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline")
            for n in names:
                for which in order:
                    binary = args.baseline if which == "baseline" else args.candidate
                    times[n][which].append(step_ms(binary, CONFIGS[n], args.steps, scratch))
    print(f"{'configuration':24} {'baseline ms':>12} {'candidate ms':>13} {'ratio':>7}")
    for n in names:
        b, c = times[n]["baseline"], times[n]["candidate"]
        ratio = statistics.median(ci / bi for bi, ci in zip(b, c))
        print(f"{n:24} {statistics.median(b):12.2f} {statistics.median(c):13.2f} {ratio:7.3f}")


if __name__ == "__main__":
    main()
