#!/usr/bin/env python3
"""Bad-input campaign: feeds Loom's tools several hundred malformed inputs and classifies
what each one does.

    python3 scripts/reliability/bad_inputs.py [--build build/release] [--json OUT.json]
                                              [--ci | --quick] [--only REGEX] [--timeout S]
                                              [--list]

Families of cases (generated, not hand-typed one by one):
  flags        train_gpt: every numeric flag with negative, zero, huge, non-numeric, empty and
               NaN/inf values; unknown flags and names; contradictory combinations; --data,
               --init and --resume given missing/empty/garbage files, a FIFO with no writer
               and /dev/zero; outputs that cannot be written (a path under a regular file,
               an existing FIFO or character device made in the case directory: the campaign
               runs as root)
  loomrun      loomrun: bad counts, ports, addresses, timeouts; missing programs
  perf         loom-perf: bad sizes, -e < -b, ops, dtypes, backends, roots; `loom-perf strategy`
  ckpt         a real checkpoint (full and sharded) with truncated, bit-flipped, removed and
               rewritten files (index.json, meta.json, the safetensors files), given to
               loom-ckpt inspect/verify/diff/convert and to train_gpt --resume; a meta.json
               copied from another step's checkpoint
  safetensors  hand-built safetensors files (struct + json) given to train_gpt --init and, as
               model.safetensors of a checkpoint, to loom-ckpt verify
  env          LOOM_* variables and the rank environment (RANK, WORLD_SIZE, ...) with bad values
  deepspeed    train_gpt --deepspeed-config files: broken JSON, wrong types, unknown keys,
               contradictions, a static loss scale that skips every step
  trace        loom-trace analyze on broken flight-recorder dumps (and a FIFO)

Each case runs one command (in a fresh temporary directory, removed afterwards; the binaries
are copied first so that a rebuild during the campaign does not change them) with a timeout
(default 20 s) and a clean environment, and is classified:
  refused      exit status 1..127 and the last line of stderr names what was wrong: the flag,
               file, variable or value (a trailing "... --help ..." hint and a launcher's
               "rank N exited with code C" epilogue are skipped; stdout's last line is used
               when stderr is empty, as loom-ckpt diff reports differences there), and the
               case's own check, if it has one, holds (the FIFO is still a FIFO, ...)
  unclear      refused, but that line names none of them (or stderr is empty)      [finding]
  refused-otherwise  refused, but the case's own check fails                       [finding]
  crash        killed by a signal, exit status >= 128, or stderr shows "terminate called",
               "Aborted", "Segmentation", "AddressSanitizer", "runtime error"     [finding]
  hang         still running at the timeout (the whole session is then killed)   [finding]
  silent       exit 0 on a bad input                                              [finding]
  accepted-ok  exit 0 on a case accepted for a recorded Reason, whose evidence holds (the
               Reason's check: output it must print, files it must leave, or a second run
               it must equal)
  accepted-otherwise  exit 0 on an accepted case whose evidence does not hold: it is
               accepted, but not for the recorded reason                         [finding]
  refused-instead  an accepted case that is now refused: a change of behaviour (fix the
               Reason, or the code)                                               [finding]
  ok           a control case (a valid input) that worked
  wrongly-refused  a control case that did not work                               [finding]
  skipped      its setup cannot be made here (mknod when not root)
After every case, new /dev/shm entries named loom* and processes left in the case's session
are counted (then removed/killed); any leftover is a finding as well.

Prints a summary table per family and, for every finding, the command and its output tail;
the last line is one summary line (cases, findings, seconds). Exit status 1 if there is any
finding, 0 otherwise. --ci runs a fixed subset (no randomness: every control, every accepted
Reason, every case marked ci, and an even spread over every category; under 3 minutes on 2
cores); --quick about 60 cases; the full campaign takes about 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import re
import shlex
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from snapshot import copy_settled  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Cases and outcomes
# ---------------------------------------------------------------------------------------------

TOOLS = {
    "train_gpt": "tools/train_gpt/train_gpt",
    "loomrun": "tools/loomrun/loomrun",
    "loom-perf": "tools/loom_perf/loom-perf",
    "loom-ckpt": "tools/loom_ckpt/loom-ckpt",
    "loom-trace": "tools/loom_trace/loom-trace",
}

# The tiny model every train_gpt case starts from (about 0.2 s a run).
TINY = {"--layers": "1", "--heads": "1", "--embd": "16", "--ctx": "16", "--batch": "2",
        "--steps": "2"}

CRASH_MARKERS = ("terminate called", "Aborted", "Segmentation", "AddressSanitizer",
                 "runtime error")
FINDING_CLASSES = ("unclear", "refused-otherwise", "crash", "hang", "silent",
                   "accepted-otherwise", "refused-instead", "wrongly-refused", "setup-error")

Setup = Callable[[Path], None]


class Skip(Exception):
    """Raised by a setup that cannot be made on this machine (mknod when not root)."""


@dataclass
class Seen:
    """What a case did, for its evidence: the case directory is still there."""
    case: "Case"
    dir: Path
    rc: Optional[int]
    stdout: str
    stderr: str
    line: str                      # the error line (refused) or stderr's last line
    seconds: float
    # rerun(args, env_changes) -> (exit status or None, stdout, stderr): the same tool run
    # again in the same directory with other arguments (an env value None unsets it).
    rerun: Callable[..., tuple[Optional[int], str, str]]

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


# A check returns None when it holds, else what was seen instead (one line).
Check = Callable[[Seen], Optional[str]]


@dataclass(frozen=True)
class Reason:
    """Why exit 0 is right for an input, and the evidence that it was accepted for that
    reason: `check` passes only when the tool did what `text` says (so a case accepted for
    another reason, e.g. a flag silently ignored, is a finding: accepted-otherwise)."""
    text: str
    shows: str                     # what `check` looks at, in words
    check: Check


@dataclass
class Case:
    family: str
    name: str
    tool: str                      # a key of TOOLS
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    setup: Optional[Setup] = None  # prepares files in the case directory
    setup_note: str = ""           # what setup does, for the report
    accept: Optional[Reason] = None  # why exit 0 is fine for this input (None: must be refused)
    control: bool = False          # a valid input: it must succeed
    mentions: tuple[str, ...] = ()  # a clear error names one of these (case-insensitive)
    expect: Optional[Check] = None  # a must-be-refused case's own check (refused-otherwise)
    expect_note: str = ""          # what `expect` checks, in words
    ok_codes: tuple[int, ...] = (0,)  # exit statuses that mean "accepted"
    note: str = ""                 # e.g. "ignored flag": shown with the finding
    timeout: Optional[float] = None  # seconds, when shorter than the campaign's
    ci: bool = False               # always in the --ci subset
    category: str = ""             # for --ci's spread; default: the name up to ':' or '='

    @property
    def id(self) -> str:
        return f"{self.family}/{self.name}"

    @property
    def group(self) -> str:
        """The case's category for --ci: its own, or its name up to ':' or '=' (the flag,
        the file, ...), or for a name without either its first word (stage-4 -> stage)."""
        base = self.category or re.split(r"[:=]", self.name)[0]
        if base == self.name:
            base = base.split("-")[0]
        return f"{self.family}/{base}"


@dataclass
class Outcome:
    case: Case
    cls: str
    rc: Optional[int]
    seconds: float
    error_line: str
    stdout: str
    stderr: str
    shm_left: list[str]
    procs_left: list[str]
    evidence: str = ""             # what a failed check saw instead

    @property
    def finding(self) -> bool:
        return self.cls in FINDING_CLASSES or bool(self.shm_left) or bool(self.procs_left)


def gpt_args(overrides: Optional[dict] = None, extra: Iterable[str] = ()) -> list[str]:
    """train_gpt's arguments: TINY with `overrides` (value None drops the flag), then `extra`."""
    flags = dict(TINY)
    for key, value in (overrides or {}).items():
        flags.pop(key, None)
        if value is not None:
            flags[key] = value
    return [a for pair in flags.items() for a in pair] + list(extra)


def gpt(family: str, name: str, overrides: Optional[dict] = None, extra: Iterable[str] = (),
        **kw) -> Case:
    """A train_gpt case (see gpt_args)."""
    return Case(family, name, "train_gpt", gpt_args(overrides, extra), **kw)


# Words a message may use for a flag instead of its name (the option or field it sets).
FLAG_ALIASES = {"--ctx": ("context",), "--vocab": ("vocab",), "--pp-balance": ("balance",),
                "--master-addr": ("host",), "--micro-batches": ("micro-batch",),
                "--grad-accum": ("accumulation",), "--nproc-per-node": ("nproc",),
                "--rdzv-endpoint": ("endpoint",), "--ddp-comm-hook": ("comm hook",),
                "--fsdp-sharding-strategy": ("sharding_strategy",),
                "--process-group-backend": ("backend",), "--nvme-buffer-count": ("buffer_count",),
                # loom-perf's short flags, by their long names
                "-b": ("minbytes", "size"), "-e": ("maxbytes", "size"), "-f": ("stepfactor",),
                "-i": ("stepbytes", "size"), "-n": ("iters",), "-w": ("warmup_iters",),
                "-c": ("check",), "-d": ("datatype",), "-o": ("op", "reduction"),
                "-z": ("blocking",), "-r": ("root",)}


def flag_mentions(flag: str, value: Optional[str] = None) -> tuple[str, ...]:
    """What a clear message about `flag VALUE` may name: the flag, its bare name (also with
    underscores), an alias, or the value (when it is not a single character)."""
    bare = flag.lstrip("-")
    names = [flag, bare, bare.replace("-", "_"), *FLAG_ALIASES.get(flag, ())]
    if value is not None and len(value.strip()) >= 2:
        names.append(value.strip())
    return tuple(names)


# ---------------------------------------------------------------------------------------------
# Setup helpers: each returns a function that prepares the case directory
# ---------------------------------------------------------------------------------------------

def chain(*steps: Optional[Setup]) -> Setup:
    def run(d: Path) -> None:
        for step in steps:
            if step is not None:
                step(d)
    return run


def write(name: str, content: bytes | str) -> Setup:
    def run(d: Path) -> None:
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return run


def mkdir(name: str) -> Setup:
    return lambda d: (d / name).mkdir(parents=True, exist_ok=True)


def copy_in(source: Path, name: str) -> Setup:
    def run(d: Path) -> None:
        if source.is_dir():
            shutil.copytree(source, d / name)
        else:
            shutil.copy(source, d / name)
    return run


def remove(name: str) -> Setup:
    return lambda d: (d / name).unlink()


def truncate(name: str, size: int) -> Setup:
    def run(d: Path) -> None:
        with open(d / name, "r+b") as f:
            f.truncate(size)
    return run


def flip(name: str, offset: int) -> Setup:
    def run(d: Path) -> None:
        data = bytearray((d / name).read_bytes())
        data[offset] ^= 0xFF
        (d / name).write_bytes(bytes(data))
    return run


def append(name: str, extra: bytes) -> Setup:
    def run(d: Path) -> None:
        with open(d / name, "ab") as f:
            f.write(extra)
    return run


def edit_json(name: str, mutate: Callable[[dict], object]) -> Setup:
    """Rewrites JSON file `name`: `mutate` changes the parsed object in place, or returns
    a replacement (a str is written as it is: broken JSON)."""
    def run(d: Path) -> None:
        obj = json.loads((d / name).read_text())
        result = mutate(obj)
        if isinstance(result, str):
            text = result
        else:
            text = json.dumps(obj if result is None else result, indent=1)
        (d / name).write_text(text)
    return run


def garbage(size: int, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(size)

def make_fifo(name: str) -> Setup:
    """A FIFO with no writer (or reader): opening it blocks until one comes."""
    def run(d: Path) -> None:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(d / name)
    return run


FULL_DEVICE = (1, 7)  # major, minor of /dev/full: every write fails with ENOSPC


def make_full_device(name: str) -> Setup:
    """A private character device in the case directory with /dev/full's numbers (writes
    fail with ENOSPC). Outputs are never pointed at the real /dev/full or anything under
    /dev: a tool that replaces its output by a rename would replace the machine's node."""
    def run(d: Path) -> None:
        try:
            os.mknod(d / name, 0o600 | stat.S_IFCHR, os.makedev(*FULL_DEVICE))
        except PermissionError as e:
            raise Skip(f"mknod {name}: {e} (the campaign needs root for this case)")
    return run


# ---------------------------------------------------------------------------------------------
# Evidence: checks that a case did what its Reason (or, refused, its own note) says
# ---------------------------------------------------------------------------------------------

LOSS_RE = re.compile(r"^step (\d+)/\d+ loss (\S+)", re.M)
SUMMARY_RE = re.compile(r"^summary: (\d+) steps[^,]*, loss (\S+) -> (\S+),", re.M)
LR_RE = re.compile(r"^step \d+/\d+ .* lr (\S+)\s*$", re.M)


def losses(text: str) -> list[str]:
    """train_gpt's printed losses (step lines and the summary): equal lists mean the same
    training, bit for bit as far as 4 decimals show (the thread count does not change bits)."""
    found = [f"{step}:{loss}" for step, loss in LOSS_RE.findall(text)]
    return found + [f"summary {n} steps {a}->{b}" for n, a, b in SUMMARY_RE.findall(text)]


def short(text: str, limit: int = 160) -> str:
    text = " | ".join(l.strip() for l in text.strip().splitlines()[-3:])
    return text if len(text) <= limit else text[:limit - 3] + "..."


def output_has(pattern: str, flags: int = re.M) -> Check:
    rx = re.compile(pattern, flags)
    return lambda seen: None if rx.search(seen.output) else f"the output lacks /{pattern}/"


def output_lacks(pattern: str, flags: int = re.M) -> Check:
    rx = re.compile(pattern, flags)

    def check(seen: Seen) -> Optional[str]:
        m = rx.search(seen.output)
        return f"the output has {m.group(0)!r}" if m else None
    return check


def line_has(pattern: str, flags: int = 0) -> Check:
    """The error line matches `pattern` (case-sensitive unless flags say otherwise)."""
    rx = re.compile(pattern, flags)
    return lambda seen: None if rx.search(seen.line) else \
        f"the error line {seen.line!r} lacks /{pattern}/"


def all_of(*checks: Check) -> Check:
    def check(seen: Seen) -> Optional[str]:
        for c in checks:
            failed = c(seen)
            if failed:
                return failed
        return None
    return check


def within(seconds: float) -> Check:
    return lambda seen: None if seen.seconds <= seconds else \
        f"took {seen.seconds:.1f} s (more than {seconds:g} s)"


def files(describe: str, holds: Callable[[Path], bool]) -> Check:
    """`holds(case directory)`; `describe` says what it should have found."""
    def check(seen: Seen) -> Optional[str]:
        try:
            return None if holds(seen.dir) else f"not so: {describe}"
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"not so: {describe} ({type(e).__name__}: {e})"
    return check


def node_kept(name: str, kind: str) -> Check:
    """`name` in the case directory is still a FIFO ("fifo") or /dev/full's character
    device ("full"): the tool did not replace or remove it."""
    def check(seen: Seen) -> Optional[str]:
        try:
            info = os.lstat(seen.dir / name)
        except OSError as e:
            return f"{name} is gone ({e.strerror})"
        if kind == "fifo" and stat.S_ISFIFO(info.st_mode):
            return None
        if kind == "full" and stat.S_ISCHR(info.st_mode) and \
                (os.major(info.st_rdev), os.minor(info.st_rdev)) == FULL_DEVICE:
            return None
        return f"{name} is no longer a {'FIFO' if kind == 'fifo' else 'character device'} " \
               f"(mode {stat.filemode(info.st_mode)}, {info.st_size} bytes)"
    return check


def json_field(name: str, key: str, value) -> Callable[[Path], bool]:
    return lambda d: json.loads((d / name).read_text())[key] == value


# Argument edits for the comparison runs.
ArgEdit = Callable[[list[str]], list[str]]


def set_flag(flag: str, value: Optional[str]) -> ArgEdit:
    """`flag VALUE` in place of the flag's current value (appended if absent; None drops
    the flag and its value)."""
    def edit(args: list[str]) -> list[str]:
        out, i, done = [], 0, False
        while i < len(args):
            if args[i] == flag:
                if value is not None:
                    out += [flag, value]
                i, done = i + 2, True
                continue
            out.append(args[i])
            i += 1
        return out if done or value is None else out + [flag, value]
    return edit


def drop_arg(arg: str) -> ArgEdit:
    return lambda args: [a for a in args if a != arg]


def edits(*steps: ArgEdit) -> ArgEdit:
    def edit(args: list[str]) -> list[str]:
        for step in steps:
            args = step(args)
        return args
    return edit


def same_losses(describe: str, edit: ArgEdit = lambda a: a, env: Optional[dict] = None,
                prepare: Optional[Setup] = None) -> Check:
    """The case's losses equal those of a second run with `edit`ed arguments and `env`
    changes (`describe`: that run, in words)."""
    def check(seen: Seen) -> Optional[str]:
        mine = losses(seen.stdout)
        if not mine:
            return "no loss lines in the output"
        if prepare:
            prepare(seen.dir)
        rc, out, err = seen.rerun(edit(list(seen.case.args)), env or {})
        if rc != 0:
            return f"the run {describe} exited {rc}: {short(err or out)}"
        theirs = losses(out)
        return None if mine == theirs else \
            f"losses {' '.join(mine)} differ from the run {describe}: {' '.join(theirs)}"
    return check


def rerun_refused(describe: str, edit: ArgEdit, pattern: str) -> Check:
    """A second run with `edit`ed arguments is refused with an error line matching
    `pattern`: the value is in effect (e.g. it makes a longer run diverge)."""
    def check(seen: Seen) -> Optional[str]:
        rc, out, err = seen.rerun(edit(list(seen.case.args)), {})
        line = error_line(err, out)
        if rc is not None and 0 < rc < 128 and re.search(pattern, line):
            return None
        return f"the run {describe} exited {rc} with {line!r}, expected /{pattern}/"
    return check


def lr_in_ramp(base: float) -> Check:
    def check(seen: Seen) -> Optional[str]:
        lrs = [float(x) for x in LR_RE.findall(seen.stdout)]
        if not lrs:
            return "no lr in the output"
        ok = all(0 < lr < base for lr in lrs) and lrs == sorted(lrs)
        return None if ok else f"lr {lrs} is not rising below {base:g}"
    return check


# ---------------------------------------------------------------------------------------------
# Reasons: every reason an input may be accepted, with its evidence, in one place each
# ---------------------------------------------------------------------------------------------

HEX = Reason("CLI11 reads 0x-prefixed integers: 0x10 is 16, a valid value",
             "the losses equal those of the same command with 16",
             same_losses("with 16 for 0x10", lambda a: ["16" if x == "0x10" else x for x in a]))
LOG_INTERVAL_HUGE = Reason(
    "documented: steps between progress lines; the first and the last step still print",
    "the output has 'step 1/2' and 'step 2/2'",
    all_of(output_has(r"^step 1/2 loss"), output_has(r"^step 2/2 loss")))
POWERSGD_RANK_CLAMPED = Reason(
    "comm_hook.cpp clamps the rank to min(rows, cols), 16 for this model, as torch's PowerSGD "
    "does", "the losses equal those with --powersgd-rank 16",
    same_losses("with --powersgd-rank 16", set_flag("--powersgd-rank", "16")))
NEVER_SAVES = Reason("documented: save every K steps, so none within this run",
                     "ck holds no step directory",
                     files("no ck/step-* directory", lambda d: not list(d.glob("ck/step-*"))))
WARMUP_RAMP = Reason("a warmup longer than the run is valid: the lr stays in its linear ramp",
                     "every printed lr is above 0, below --lr (1e-3) and rising",
                     lr_in_ramp(1e-3))
POWERSGD_NOT_YET = Reason(
    "documented: plain allreduce before that many backward passes",
    "the losses equal those of the same run with the default allreduce hook",
    same_losses("without the PowerSGD hook", edits(set_flag("--ddp-comm-hook", None),
                                                   set_flag("--powersgd-start-iter", None))))


def no_clipping(why: str) -> Reason:
    return Reason(f"{why}: no gradient reaches the bound, no clipping in effect",
                  "the losses equal those with --grad-clip 0 (off)",
                  same_losses("with --grad-clip 0", set_flag("--grad-clip", "0")))


def first_sgd_step(flag: str, usual: Optional[str]) -> Reason:
    return Reason(
        f"in the documented range (>= 0); in 2 steps {flag} does not act (SGD's first update "
        "takes the gradient as its momentum buffer, as torch's does); longer runs diverge and "
        "are stopped naming the step",
        f"the losses equal those with {flag} {usual or '(unset)'}, and with --steps 3 the run "
        "stops naming the divergence",
        all_of(same_losses(f"with {flag} {usual}", set_flag(flag, usual)),
               rerun_refused("with --steps 3", set_flag("--steps", "3"), r"diverged")))


EPS_HUGE = Reason("in the documented range (above 0): AdamW's updates become about 0",
                  "the losses equal those of the same run with --lr 0",
                  same_losses("with --lr 0", set_flag("--lr", "0")))


def one_bucket(why: str) -> Reason:
    return Reason(f"{why}: every gradient in one bucket",
                  "the losses equal those with the default 25 MiB (one bucket for this model)",
                  same_losses("with --bucket-cap-mb 25", set_flag("--bucket-cap-mb", "25")))


MFU_ONLY = Reason("in the documented range (above 0); only the MFU line of GPU runs uses it",
                  "no MFU line, and the losses equal those without the flag",
                  all_of(output_lacks("MFU"),
                         same_losses("without --peak-tflops", set_flag("--peak-tflops", None))))
PRECISION_32 = Reason("strategy.cpp accepts \"32\" as Lightning's alias of 32-true",
                      "the losses equal those with --precision 32-true",
                      same_losses("with 32-true", set_flag("--precision", "32-true")))
DASHDASH = Reason("'--' ends the options (POSIX); nothing follows it",
                  "the losses equal those without '--'",
                  same_losses("without '--'", drop_arg("--")))
BYTES_ARE_TOKENS = Reason("bytes are tokens (vocabulary 256): any bytes are valid data",
                          "train_gpt reports blocks of tokens from garbage.bin",
                          output_has(r"\d+ blocks of 2 x 16 tokens from garbage\.bin"))
AUTO_STARTS_AT_0 = Reason(
    "documented: --resume auto starts at step 0 when there is no committed checkpoint "
    "(readers ignore an unmarked step directory)",
    "train_gpt says it starts at step 0 and runs all 4 steps",
    all_of(output_has(r"no committed checkpoint under d: starting at step 0"),
           output_has(r"^summary: 4 steps, ")))
NO_TIME_LIMIT = Reason("the value satisfies the check (> 0): a limit the job never reaches",
                       "the program ran (loomrun exit 0, no 'ran longer than' message)",
                       output_lacks(r"ran longer than"))
ONE_SIZE = Reason("options.cpp: a zero minimum measures one size only (commented)",
                  "exactly one result row, of 0 bytes",
                  lambda seen: None if re.findall(r"^\s+(\d+)\s+\d+\s+float", seen.stdout,
                                                  re.M) == ["0"]
                  else "result rows: " + ",".join(re.findall(r"^\s+(\d+)\s+\d+\s+float",
                                                             seen.stdout, re.M)))
ITERS_ZERO = Reason("the help documents -n as NONNEGATIVE: nothing is timed (the time column "
                    "is an empty loop's)",
                    "the header says 'iters: 0' and the 8-64 B rows are there",
                    all_of(output_has(r" iters: 0 "), output_has(r"^\s+64\s+16\s+float")))
WARMUP_CLAMPED = Reason("a warm-up longer than the run: the last step is timed "
                        "(strategy_bench.cpp clamps it)",
                        "the report says '1 steps timed after 2 warm-up'",
                        output_has(r"1 steps timed after 2 warm-up"))
INSPECT_NO_DATA = Reason("inspect reads index.json and meta.json only; verify checks the data",
                         "inspect lists the tensors and says nothing of checksums",
                         all_of(output_has(r"^\s+wte\.weight\s+f32"),
                                output_lacks(r"(?i)checksum|corrupt")))
DIFF_TENSORS = Reason("diff compares tensors; meta.json is not a tensor",
                      "diff says the checkpoints are equal",
                      output_has(r"^the checkpoints are equal"))


def inspect_shows(pattern: str) -> Reason:
    return Reason("inspect shows meta.json's values as they are",
                  f"inspect's summary line matches /{pattern}/", output_has(pattern))


VERIFY_TYPES_ONLY = Reason(
    "verify checks meta.json's types and ranges and its step and optimizer against the "
    "state's, not the batch",
    "verify says meta.json is valid and every checksum matches",
    output_has(r"meta\.json is valid; .* every checksum matches"))


def convert_copies(key: str, value) -> Reason:
    return Reason("convert copies meta.json's values as they are",
                  f"out/meta.json has {key} {value!r}",
                  files(f"out/meta.json's {key} is {value!r}",
                        json_field("out/meta.json", key, value)))


RESUMES_FROM_2 = ("train_gpt resumes from step 2 and runs steps 3-4",
                  all_of(output_has(r"resuming from ck \(2 steps done"),
                         output_has(r"steps 3-4, resumed")))
BATCH_MAY_CHANGE = Reason("docs/checkpoints.md: only the model and optimizer must match; the "
                          "batch may change on resume", *RESUMES_FROM_2)
STRAY = "an unlisted extra file is not part of the checkpoint"
STRAY_IGNORED = {  # consumer -> its evidence that notes.txt was left alone
    "inspect": Reason(STRAY, "inspect lists the tensors and not notes.txt",
                      all_of(output_has(r"^\s+wte\.weight\s+f32"), output_lacks("notes"))),
    "verify": Reason(STRAY, "verify counts 2 files, every checksum matching",
                     output_has(r"in \d+ shards of 2 files, .*every checksum matches")),
    "diff": DIFF_TENSORS,
    "convert": Reason(STRAY, "out/ is committed without notes.txt",
                      files("out/COMMITTED exists, out/notes.txt does not",
                            lambda d: (d / "out/COMMITTED").exists()
                            and not (d / "out/notes.txt").exists())),
    "resume": Reason(STRAY, *RESUMES_FROM_2),
}
I32_CONVERTED = Reason("a well-formed file; the I32 values are converted to the parameter's "
                       "dtype, as torch's load_state_dict (copy_) does",
                       "the first loss is huge (f32 bit patterns read as integers, ~1e9)",
                       output_has(r"^step 1/2 loss \d{7,}\."))
SHM_TINY_SIZE = Reason("1 byte is a positive size (rounded up to 64), slow but valid",
                       "the losses equal those without the variable",
                       lambda seen: same_losses("without the variable",
                                                env={k: None for k in seen.case.env})(seen))
RANK_ENV_UNREAD = Reason("single_device does not read the cluster environment",
                         "the losses equal those without RANK and WORLD_SIZE",
                         same_losses("without RANK and WORLD_SIZE",
                                     env={"RANK": None, "WORLD_SIZE": None}))
FREE_TEXT = Reason("free text copied into the report", "the report's '# Command:' line holds it",
                   output_has(r"^# Command: \x01;\$$"))
DS_AUTO = Reason(
    "DeepSpeed's \"auto\" is documented: the flags' values hold (train_gpt's --batch 8 and "
    "--grad-clip 1; stage 0, DeepSpeed's default, is fsdp NO_SHARD)",
    "the losses equal those of a config spelling out micro batch 8, stage 0 and clipping 1",
    same_losses("with ds-explicit.json", set_flag("--deepspeed-config", "ds-explicit.json"),
                prepare=write("ds-explicit.json", json.dumps(
                    {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 0},
                     "gradient_clipping": 1.0}))))
TRACE_GAP = Reason("a well-formed dump: the analysis names the first gap (exit 1)",
                   "the analysis names seq 1 as not reached by every rank",
                   output_has(r"seq 1: not every rank reached it"))



# ---------------------------------------------------------------------------------------------
# Safetensors files built by hand
# ---------------------------------------------------------------------------------------------

def read_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def safetensors_bytes(header: dict | bytes, data: bytes, length: Optional[int] = None) -> bytes:
    """8-byte little-endian header length, the header, the data; `length` overrides the prefix
    (it may lie about the header)."""
    text = header if isinstance(header, bytes) else compact_json(header).encode()
    text += b" " * (-len(text) % 8)
    prefix = struct.pack("<Q", len(text) if length is None else length)
    return prefix + text + data


def compact_json(obj) -> str:
    return json.dumps(obj, separators=(",", ":"))


def header_end(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


# ---------------------------------------------------------------------------------------------
# Fixtures: a real small model file and checkpoints, made once per campaign
# ---------------------------------------------------------------------------------------------

class Fixtures:
    """init.safetensors (train_gpt --save), a full-format checkpoint (single device) and a
    sharded one (ddp_spawn on 2 ranks), all of the TINY model after 2 steps, and the
    checkpoints of steps 1 to 3 of a run saving every step."""

    def __init__(self, root: Path, tools: dict[str, Path]):
        self.dir = root / "fixtures"
        self.dir.mkdir()
        self.init = self.dir / "init.safetensors"
        self.full = self.dir / "full" / "step-00000002"
        self.sharded = self.dir / "sharded" / "step-00000002"
        self.steps = self.dir / "steps"  # step-00000001 .. step-00000003
        tiny = [a for pair in TINY.items() for a in pair]
        self._make(tools, tiny + ["--save", str(self.init)])
        self._make(tools, tiny + ["--checkpoint-dir", str(self.dir / "full"), "--save-every", "2"])
        self._make(tools, tiny + ["--checkpoint-dir", str(self.dir / "sharded"), "--save-every",
                                  "2", "--strategy", "ddp_spawn", "--devices", "2",
                                  "--checkpoint-format", "sharded"])
        self._make(tools, gpt_args({"--steps": "3"}, ["--checkpoint-dir", str(self.steps),
                                                      "--save-every", "1"]))
        for path in (self.init, self.full / "COMMITTED", self.sharded / "rank-00001.safetensors",
                     self.steps / "step-00000003" / "COMMITTED"):
            if not path.exists():
                sys.exit(f"bad_inputs: fixture {path} was not made")

    def _make(self, tools: dict[str, Path], args: list[str]) -> None:
        done = subprocess.run([str(tools["train_gpt"])] + args, cwd=self.dir, env=clean_env(),
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            sys.exit(f"bad_inputs: cannot make a fixture: train_gpt {' '.join(args)}\n"
                     f"{done.stderr}")


# ---------------------------------------------------------------------------------------------
# Family 1: train_gpt flags
# ---------------------------------------------------------------------------------------------

# flag -> (kind, context overrides that make the flag take effect)
DDP2 = {"--strategy": "ddp_spawn", "--devices": "2"}
NUMERIC_FLAGS: dict[str, tuple[str, dict]] = {
    "--layers": ("int>=1", {}), "--heads": ("int>=1", {}), "--embd": ("int>=1", {}),
    "--ctx": ("int>=1", {}), "--vocab": ("int>=1", {}), "--batch": ("int>=1", {}),
    "--steps": ("int>=1", {}), "--grad-accum": ("int>=1", {}),
    "--log-interval": ("int>=1", {}),
    "--powersgd-rank": ("int>=1", {**DDP2, "--ddp-comm-hook": "powersgd",
                                   "--powersgd-start-iter": "0"}),
    "--save-every": ("int>=0", {"--checkpoint-dir": "ck"}),
    "--keep-last": ("int>=0", {"--checkpoint-dir": "ck", "--save-every": "1"}),
    "--warmup-steps": ("int>=0", {}),
    "--powersgd-start-iter": ("int>=0", {**DDP2, "--ddp-comm-hook": "powersgd"}),
    "--local-sgd-period": ("int>=0", DDP2), "--local-sgd-warmup": ("int>=0", DDP2),
    "--threads": ("int0..65536", {}),
    "--pp": ("int1..65536", {}), "--tp": ("int1..65536", {}),
    "--micro-batches": ("int1..65536", {"--pp": "2"}),
    "--pp-chunks": ("int1..65536", {"--pp": "2", "--layers": "2", "--micro-batches": "2",
                                    "--pp-schedule": "interleaved_1f1b"}),
    "--lr": ("float>=0", {}), "--weight-decay": ("float>=0", {}),
    "--grad-clip": ("float>=0", {}),
    "--momentum": ("float>=0", {"--optimizer": "sgd"}),
    "--dampening": ("float>=0", {"--optimizer": "sgd", "--momentum": "0.9"}),
    "--beta1": ("float0..0.999999", {}), "--beta2": ("float0..0.999999", {}),
    "--eps": ("float>0", {}), "--bucket-cap-mb": ("float>0", DDP2),
    "--peak-tflops": ("float>0", {}),
    "--seed": ("uint", {}),
}

BAD_VALUES = {
    "int>=1": ["-1", "0", "9999999999999", "1e30", "abc", "", "nan", "inf", "1.5", "0x10"],
    "int>=0": ["-1", "9999999999999", "1e30", "abc", "", "nan", "inf", "1.5"],
    "int0..65536": ["-1", "65537", "9999999999999", "1e30", "abc", "", "nan", "inf", "1.5"],
    "int1..65536": ["-1", "0", "65537", "9999999999999", "abc", "", "nan", "inf", "1.5"],
    "float>=0": ["-1", "-1e-9", "1e30", "abc", "", "nan", "inf", "-inf", "1e400"],
    "float>0": ["0", "-0", "-1", "1e30", "abc", "", "nan", "inf"],
    "float0..0.999999": ["-0.1", "1", "1e30", "abc", "", "nan", "inf"],
    "uint": ["-1", "18446744073709551616", "1e30", "abc", "", "1.5"],
}

# (flag, value) pairs whose acceptance is legitimate, with the reason and its evidence.
# No longer here, because they are refused now: --keep-last, --local-sgd-period and
# --local-sgd-warmup 9999999999999 (beyond an int: "Could not convert"), --seed -1 (refused
# naming the range 0 to 2^64-1).
LEGIT_VALUES = {
    ("--warmup-steps", "9999999999999"): WARMUP_RAMP,
    ("--save-every", "9999999999999"): NEVER_SAVES,
    ("--log-interval", "9999999999999"): LOG_INTERVAL_HUGE,
    ("--powersgd-start-iter", "9999999999999"): POWERSGD_NOT_YET,
    ("--eps", "1e30"): EPS_HUGE,
    ("--powersgd-rank", "9999999999999"): POWERSGD_RANK_CLAMPED,
    ("--grad-clip", "1e30"): no_clipping("in the documented range (>= 0)"),
    ("--grad-clip", "inf"): no_clipping("inf satisfies the documented bound (>= 0)"),
    ("--grad-clip", "1e400"): no_clipping("strtod reads it as inf, as --grad-clip inf"),
    ("--bucket-cap-mb", "1e30"): one_bucket("in the documented range (above 0)"),
    ("--bucket-cap-mb", "inf"): one_bucket("inf satisfies the documented bound; compared as a "
                                           "double"),
    ("--peak-tflops", "1e30"): MFU_ONLY,
    ("--peak-tflops", "inf"): MFU_ONLY,
    ("--momentum", "1e30"): first_sgd_step("--momentum", "0.9"),
    ("--dampening", "1e30"): first_sgd_step("--dampening", None),
}
# Values that are valid but would make the run last for ever: not a bad input, not run.
SKIPPED_VALUES = {("--steps", "9999999999999"), ("--grad-accum", "9999999999999")}


def numeric_flag_cases() -> list[Case]:
    cases = []
    for flag, (kind, context) in NUMERIC_FLAGS.items():
        for value in BAD_VALUES[kind]:
            if (flag, value) in SKIPPED_VALUES:
                continue
            name = f"{flag.lstrip('-')}={value if value else '<empty>'}"
            accept = LEGIT_VALUES.get((flag, value))
            mentions = flag_mentions(flag, value)
            note = ""
            if value == "0x10" and flag == "--vocab":
                # 16 is read, and then the built-in corpus's bytes do not fit: the refusal
                # is the evidence that 0x10 is 16
                mentions, note = ("vocabulary of 16",), "0x10 read as 16"
            elif value == "0x10":
                accept = HEX
            if value == "1e30" and kind.startswith("float"):
                mentions += ("diverged",)  # in range, but training then blows up: a fine stop
            cases.append(gpt("flags", name, {**context, flag: value}, accept=accept,
                             mentions=mentions, note=note))
    return cases


NAME_FLAGS = {  # flag -> bad names
    "--strategy": ["nope", "", "DDP", "ddp_spawn ", "deepspeed_stage_4"],
    "--precision": ["fp8", "", "32", "bf16", "64-true"],
    "--ddp-comm-hook": ["nope", "", "PowerSGD"],
    "--process-group-backend": ["mpi", "", "gloo"],
    "--optimizer": ["adam", "", "SGD"],
    "--schedule": ["linear", ""],
    "--pp-schedule": ["1F1B", "dualpipe"],
    "--pp-dp": ["fsdp"],
    "--pp-balance-by": ["flops"],
    "--checkpoint-format": ["zip", ""],
    "--activation-checkpointing": ["all", "block"],
    "--accelerator": ["tpu", ""],
    "--preset": ["gpt2-xl"],
    "--param-dtype": ["f64", "fp16"],
    "--reduce-dtype": ["i32"],
    "--weights-dtype": ["f64", "i32"],
    "--backward-prefetch": ["later"],
    "--fsdp-sharding-strategy": ["HALF_SHARD", ""],
    "--wrap-policy": ["NoSuchModule", "min_params:abc", "min_params:-1", "min_params:"],
    "--devices": ["0", "-2", "abc", "", "1e30", "99999999999", "0,1", "1,,2"],
    "--powersgd-warm-start": ["maybe", ""],
    "--pp-balance": ["0,3", "a,b", "-1,4", "1", "1,1,1,1,1"],
}
# Sharding-only flags need a sharded strategy to be checked; the bad name goes with one.
NAME_CONTEXT = {
    "--param-dtype": {"--strategy": "fsdp"}, "--reduce-dtype": {"--strategy": "fsdp"},
    "--weights-dtype": {"--strategy": "fsdp"},
    "--backward-prefetch": {"--strategy": "fsdp"},
    "--fsdp-sharding-strategy": {"--strategy": "fsdp"},
    "--wrap-policy": {"--strategy": "fsdp"},
    "--powersgd-warm-start": {**DDP2, "--ddp-comm-hook": "powersgd"},
    "--pp-balance": {"--pp": "2"},
    "--ddp-comm-hook": DDP2, "--process-group-backend": DDP2,
    "--pp-dp": {"--pp": "2"}, "--pp-schedule": {"--pp": "2"},
    "--pp-balance-by": {"--pp": "2"},
}


NAME_LEGIT = {("--precision", "32"): PRECISION_32}
# A class name the model does not have (NoSuchModule, or the typo Blok of Block): refused
# naming the wrap policy and the classes the model has (it used to warn and wrap the whole
# model as one unit, which hid typos).
WRAP_CLASSES = (r"Block", "the error line names the model's classes (Block)")


def name_flag_cases() -> list[Case]:
    cases = []
    for flag, values in NAME_FLAGS.items():
        for value in values:
            name = f"{flag.lstrip('-')}={value if value else '<empty>'}"
            context = NAME_CONTEXT.get(flag, {})
            wrap_class = flag == "--wrap-policy" and value == "NoSuchModule"
            cases.append(gpt("flags", name, {**context, flag: value},
                             accept=NAME_LEGIT.get((flag, value)),
                             mentions=flag_mentions(flag, value),
                             expect=line_has(WRAP_CLASSES[0]) if wrap_class else None,
                             expect_note=WRAP_CLASSES[1] if wrap_class else "",
                             ci=wrap_class))
    cases.append(gpt("flags", "wrap-policy=Blok:fsdp-2", {"--strategy": "fsdp", "--devices": "2",
                                                          "--wrap-policy": "Blok"},
                     mentions=("--wrap-policy", "wrap policy", "wrap_policy"),
                     expect=all_of(line_has("Blok"), line_has(WRAP_CLASSES[0])),
                     expect_note="the error line names 'Blok' and the model's classes (Block)",
                     note="a typo of a module class name", ci=True))
    return cases


def unknown_flag_cases() -> list[Case]:
    spellings = [(["--nope"], "--nope"), (["--layer", "1"], "--layer"), (["-x"], "-x"),
                 (["extra_positional"], "extra_positional"), (["--steps=2=3"], "steps"),
                 (["--lr", "1e-3", "--lr", "2e-3"], "--lr"), (["--"], "--"),
                 (["--nesterov=maybe"], "nesterov")]
    return [gpt("flags", f"unknown:{' '.join(args)}", extra=args, mentions=(mention,),
                accept=DASHDASH if args == ["--"] else None)
            for args, mention in spellings]


# Contradictions: (name, overrides, mentions, note). Documented ones first, then flags that
# mean nothing in their context (the README's rule for the sharding flags, by analogy).
CONTRADICTIONS = [
    ("tp-with-ddp", {"--tp": "2", "--strategy": "ddp_spawn"}, ("--tp",), ""),
    ("pp-with-ddp", {"--pp": "2", "--strategy": "ddp_spawn"}, ("--pp",), ""),
    ("batch-not-split-by-micro-batches", {"--pp": "2", "--batch": "3", "--micro-batches": "2"},
     ("--batch", "--micro-batches"), ""),
    ("interleaved-micro-batches-not-multiple",
     {"--pp": "2", "--layers": "2", "--pp-schedule": "interleaved_1f1b", "--micro-batches": "3"},
     ("--micro-batches",), ""),
    ("tp-not-dividing-heads", {"--tp": "3", "--heads": "2"}, ("--tp",), ""),
    ("pp-more-stages-than-layers", {"--pp": "4"}, ("--pp",), ""),
    ("save-every-without-checkpoint-dir", {"--save-every": "1"}, ("--save-every",), ""),
    ("resume-auto-without-checkpoint-dir", {"--resume": "auto"}, ("--resume",), ""),
    ("devices-3-under-ddp-without-launcher", {"--strategy": "ddp", "--devices": "3"},
     ("--devices",), ""),
    ("devices-2-single-device", {"--devices": "2"}, ("--devices", "devices"), ""),
    ("accelerator-cuda-without-gpu", {"--accelerator": "cuda"}, ("cuda", "gpu"), ""),
    ("nccl-backend-on-cpu", {**DDP2, "--process-group-backend": "nccl"}, ("nccl",), ""),
    ("sequence-parallel-ctx-not-divisible", {"--tp": "2", "--heads": "2", "--ctx": "15"},
     ("sequence",), ""),
    ("nesterov-without-momentum", {"--optimizer": "sgd"}, ("nesterov", "momentum"), ""),
    ("nesterov-with-dampening", {"--optimizer": "sgd", "--momentum": "0.9",
                                 "--dampening": "0.5"}, ("nesterov", "dampening"), ""),
    ("nesterov-with-adamw", {}, ("nesterov",), "ignored flag"),
    ("momentum-with-adamw", {"--momentum": "0.9"}, ("momentum",), "ignored flag"),
    ("checkpoint-format-without-dir", {"--checkpoint-format": "sharded"},
     ("--checkpoint-format",), "ignored flag"),
    ("async-save-without-dir", {}, ("--async-save",), "ignored flag"),
    ("keep-last-without-dir", {"--keep-last": "2"}, ("--keep-last",), "ignored flag"),
    ("powersgd-hook-single-device", {"--ddp-comm-hook": "powersgd"}, ("ddp-comm-hook",),
     "ignored flag"),
    ("powersgd-rank-without-powersgd", {**DDP2, "--powersgd-rank": "4"}, ("powersgd",),
     "ignored flag"),
    ("sequence-parallel-without-tp", {}, ("sequence-parallel",), "ignored flag"),
    ("micro-batches-without-pp", {"--micro-batches": "2"}, ("micro-batches",), "ignored flag"),
    ("pp-chunks-without-interleaved", {"--pp": "2", "--pp-chunks": "3"}, ("pp-chunks",),
     "ignored flag"),
    ("local-sgd-single-device", {"--local-sgd-period": "2"}, ("local-sgd",), "ignored flag"),
    ("bucket-cap-single-device", {"--bucket-cap-mb": "1"}, ("bucket-cap",), "ignored flag"),
]
CONTRADICTION_FLAGS = {  # boolean flags some contradictions add
    "sequence-parallel-ctx-not-divisible": ["--sequence-parallel"],
    "nesterov-without-momentum": ["--nesterov"],
    "nesterov-with-dampening": ["--nesterov"],
    "nesterov-with-adamw": ["--nesterov"],
    "async-save-without-dir": ["--async-save"],
    "sequence-parallel-without-tp": ["--sequence-parallel"],
}
SHARDING_FLAGS = [("--wrap-policy", "Block"), ("--fsdp-sharding-strategy", "SHARD_GRAD_OP"),
                  ("--forward-prefetch", None), ("--backward-prefetch", "post"),
                  ("--nvme-path", "."), ("--param-dtype", "bf16"), ("--reduce-dtype", "bf16"),
                  ("--weights-dtype", "bf16")]


def contradiction_cases() -> list[Case]:
    cases = []
    for name, overrides, mentions, note in CONTRADICTIONS:
        cases.append(gpt("flags", f"contradiction:{name}", overrides,
                         extra=CONTRADICTION_FLAGS.get(name, []), mentions=mentions, note=note))
    for flag, value in SHARDING_FLAGS:  # documented: refused under a replicating strategy
        extra = [flag] if value is None else [flag, value]
        cases.append(gpt("flags", f"contradiction:{flag.lstrip('-')}-under-ddp", DDP2,
                         extra=extra, mentions=(flag,)))
    cases.append(gpt("flags", "control:dp-devices-2", {"--strategy": "dp", "--devices": "2"},
                     control=True))
    cases.append(gpt("flags", "control:beta1-edge", {"--beta1": "0.999999"}, control=True))
    cases.append(gpt("flags", "warmup-longer-than-run", {"--warmup-steps": "5"},
                     accept=WARMUP_RAMP))
    return cases


def data_cases(fx: Fixtures) -> list[Case]:
    rows = [  # (name, value of --data, setup, mentions, accept)
        ("directory", "somedir", mkdir("somedir"), ("--data", "somedir"), None),
        ("missing", "missing.bin", None, ("--data", "missing.bin"), None),
        ("empty-path", "", None, ("--data",), None),
        ("empty-file", "empty.bin", write("empty.bin", b""), ("--data", "0 tokens", "empty.bin"),
         None),
        ("one-byte", "one.bin", write("one.bin", b"a"), ("--data", "1 tokens", "one.bin"), None),
        ("too-short", "short.bin", write("short.bin", b"x" * 32), ("--data", "32 tokens",
                                                                   "short.bin"), None),
        ("dev-null", "/dev/null", None, ("--data", "/dev/null", "0 tokens"), None),
        ("binary-garbage", "garbage.bin", write("garbage.bin", garbage(4096)), (),
         BYTES_ARE_TOKENS),
        ("dev-zero", "/dev/zero", None, ("--data", "/dev/zero"), None),
    ]
    cases = [gpt("flags", f"data:{n}", extra=["--data", v], setup=s, mentions=m, accept=a,
                 setup_note=f"--data {v!r}")
             for n, v, s, m, a in rows]
    cases[-1].ci = True  # dev-zero: refused as not a regular file, not read until memory ends
    cases.append(gpt("flags", "data:fifo-without-writer", extra=["--data", "fifo"],
                     setup=make_fifo("fifo"), setup_note="fifo: a FIFO nobody writes to",
                     mentions=("--data", "fifo"), expect=within(5.0),
                     expect_note="refused within 5 s, not blocked opening it", timeout=10.0,
                     ci=True))
    cases.append(gpt("flags", "data:bytes-outside-vocab", {"--vocab": "100"},
                     extra=["--data", "garbage.bin"], setup=write("garbage.bin", garbage(4096)),
                     mentions=("vocab", "token")))
    return cases


def init_file_cases(fx: Fixtures) -> list[Case]:
    size = fx.init.stat().st_size
    rows = [  # (name, setup, mentions)
        ("missing", None, ("--init", "w.safetensors")),
        ("directory", mkdir("w.safetensors"), ("--init", "w.safetensors")),
        ("empty", write("w.safetensors", b""), ("w.safetensors",)),
        ("garbage", write("w.safetensors", garbage(1000)), ("w.safetensors",)),
        ("text", write("w.safetensors", "hello, this is not a model\n"), ("w.safetensors",)),
    ]
    for cut in (4, 8, 100, header_end(fx.init), size // 2, size - 1):
        rows.append((f"truncated-at-{cut}", chain(copy_in(fx.init, "w.safetensors"),
                                                  truncate("w.safetensors", cut)),
                     ("w.safetensors",)))
    cases = [gpt("flags", f"init:{n}", {k: None for k in ("--layers", "--heads", "--embd",
                                                          "--ctx")},
                 extra=["--init", "w.safetensors"], setup=s, mentions=m) for n, s, m in rows]
    cases.append(gpt("flags", "init:other-architecture", {"--embd": "32"},
                     extra=["--init", "w.safetensors"], setup=copy_in(fx.init, "w.safetensors"),
                     mentions=("--embd",)))
    cases.append(gpt("flags", "init:dev-null", extra=["--init", "/dev/null"],
                     mentions=("/dev/null", "--init")))
    return cases


def output_path_cases() -> list[Case]:
    blocker = write("blocker", "a regular file\n")
    cases = []
    for flag, filename in (("--save", "w.safetensors"), ("--metrics", "m.jsonl"),
                           ("--trace", "t.json")):
        short = flag.lstrip("-")
        for where, value, setup in (("under-a-file", f"blocker/{filename}", blocker),
                                    ("missing-folder", f"nofolder/{filename}", None),
                                    ("is-a-folder", "adir", mkdir("adir")),
                                    ("empty", "", None)):
            cases.append(gpt("flags", f"output:{short}-{where}", extra=[flag, value],
                             setup=setup, mentions=flag_mentions(flag, value)))
    cases.append(gpt("flags", "output:metrics-full-device", extra=["--metrics", "full"],
                     setup=make_full_device("full"),
                     setup_note="full: a character device 1,7 (a private /dev/full)",
                     mentions=("--metrics", "full"), expect=node_kept("full", "full"),
                     expect_note="full is still the character device", ci=True))
    # Outputs that exist and are not regular files: refused naming the path, the node left
    # as it was (a save that renames a temporary file over it would replace it).
    for flag in ("--save", "--trace"):
        for kind, setup, what in (("fifo", make_fifo("node"), "a FIFO nobody reads"),
                                  ("full", make_full_device("node"),
                                   "a character device 1,7 (a private /dev/full)")):
            cases.append(gpt("flags", f"output:{flag.lstrip('-')}-existing-{kind}",
                             extra=[flag, "node"], setup=setup, setup_note=f"node: {what}",
                             mentions=(flag, "node"), expect=node_kept("node", kind),
                             expect_note=f"node is still {what}", timeout=10.0, ci=True))
    for where, value, setup in (("under-a-file", "blocker/ck", blocker),
                                ("parent-missing", "nofolder/sub/ck", None),
                                ("is-a-file", "blocker", blocker)):
        cases.append(gpt("flags", f"output:checkpoint-dir-{where}",
                         {"--checkpoint-dir": value, "--save-every": "1"}, setup=setup,
                         mentions=flag_mentions("--checkpoint-dir", value)))
    cases.append(gpt("flags", "output:nvme-path-under-a-file",
                     {"--strategy": "deepspeed_stage_3_offload_nvme", "--nvme-path": "blocker/n"},
                     setup=blocker, mentions=("--nvme-path", "nvme", "blocker/n")))
    return cases


def resume_path_cases(fx: Fixtures) -> list[Case]:
    four = {"--steps": "4"}
    return [
        gpt("flags", "resume:missing", four, extra=["--resume", "nothere"],
            mentions=("--resume", "nothere")),
        gpt("flags", "resume:regular-file", four, extra=["--resume", "afile"],
            setup=write("afile", "x"), mentions=("--resume", "afile")),
        gpt("flags", "resume:empty-dir", four, extra=["--resume", "adir"], setup=mkdir("adir"),
            mentions=("--resume", "adir")),
        gpt("flags", "resume:empty-string", four, extra=["--resume", ""], mentions=("--resume",)),
        gpt("flags", "resume:uncommitted", four, extra=["--resume", "ck"],
            setup=chain(copy_in(fx.full, "ck"), remove("ck/COMMITTED")),
            mentions=("COMMITTED", "committed")),
        gpt("flags", "resume:auto-empty-dir", {**four, "--checkpoint-dir": "d",
                                               "--resume": "auto"}, setup=mkdir("d"),
            accept=AUTO_STARTS_AT_0),
        gpt("flags", "resume:auto-only-uncommitted", {**four, "--checkpoint-dir": "d",
                                                      "--resume": "auto"},
            setup=chain(mkdir("d"), copy_in(fx.full, "d/step-00000002"),
                        remove("d/step-00000002/COMMITTED")),
            accept=AUTO_STARTS_AT_0),
        gpt("flags", "resume:more-steps-than-run", {"--steps": "1"}, extra=["--resume", "ck"],
            setup=copy_in(fx.full, "ck"), mentions=("--steps", "steps")),
        gpt("flags", "resume:other-model", {**four, "--embd": "32"}, extra=["--resume", "ck"],
            setup=copy_in(fx.full, "ck"), mentions=("another model", "model")),
        gpt("flags", "resume:other-optimizer", {**four, "--optimizer": "sgd"},
            extra=["--resume", "ck"], setup=copy_in(fx.full, "ck"),
            mentions=("sgd", "adamw", "optimizer")),
        gpt("flags", "control:resume", four, extra=["--resume", "ck"],
            setup=copy_in(fx.full, "ck"), control=True),
    ]


def flag_family(fx: Fixtures) -> list[Case]:
    return (numeric_flag_cases() + name_flag_cases() + unknown_flag_cases()
            + contradiction_cases() + data_cases(fx) + init_file_cases(fx)
            + output_path_cases() + resume_path_cases(fx))


# ---------------------------------------------------------------------------------------------
# Family 2: loomrun
# ---------------------------------------------------------------------------------------------

PORT_FLAGS = ("--master-port", "--nnodes", "--rdzv-endpoint", "--standalone")


def loomrun_case(name: str, flags: list[str], program: Optional[list[str]] = None, **kw) -> Case:
    """loomrun FLAGS PROGRAM (default /bin/true), on a free store port unless FLAGS choose one
    (29500 may be busy with another job on this machine)."""
    program = ["/bin/true"] if program is None else program
    if not any(f in flags for f in PORT_FLAGS):
        flags = ["--master-port", "0"] + flags
    return Case("loomrun", name, "loomrun", flags + program, **kw)


LOOMRUN_BAD = {  # flag -> bad values
    "--nproc-per-node": ["0", "-1", "abc", "", "9999999999999", "1.5"],
    "--nnodes": ["0", "-1", "abc", "", "2:3", "1:", ":1", "1:1:1"],
    "--node-rank": ["-1", "1", "abc"],
    "--master-port": ["-1", "65536", "99999", "abc", ""],
    "--max-restarts": ["-1", "abc", "9999999999999"],
    "--bind": ["cores", ""],
    "--timeout": ["0", "-1", "abc", "nan", "-inf"],
    "--grace-period": ["-1", "nan", "abc"],
    "--rdzv-endpoint": ["localhost:abc", "localhost:99999", "localhost:-5"],
    "--master-addr": ["", "999.1.1.1", "no.such.host.invalid"],
}


def loomrun_family(tools: dict[str, Path]) -> list[Case]:
    cases = []
    for flag, values in LOOMRUN_BAD.items():
        for value in values:
            name = f"{flag.lstrip('-')}={value if value else '<empty>'}"
            cases.append(loomrun_case(name, [flag, value], mentions=flag_mentions(flag, value)))
    cases += [
        loomrun_case("nnodes-2-without-secret", ["--nnodes", "2", "--master-port", "29511"],
                     mentions=("LOOM_STORE_SECRET", "--nnodes")),
        loomrun_case("master-port-0-with-nnodes-2", ["--nnodes", "2", "--master-port", "0"],
                     env={"LOOM_STORE_SECRET": "s"}, mentions=("--master-port",)),
        loomrun_case("standalone-with-nnodes-2", ["--standalone", "--nnodes", "2"],
                     mentions=("--standalone", "--nnodes")),
        loomrun_case("unknown-flag", ["--nope"], mentions=("--nope",)),
        # a program that runs a moment: /bin/true may end before loomrun looks at the clock
        loomrun_case("timeout-inf", ["--timeout", "inf"], ["/bin/sleep", "0.3"],
                     accept=NO_TIME_LIMIT),
        loomrun_case("timeout-1e30", ["--timeout", "1e30"], ["/bin/sleep", "0.3"],
                     accept=NO_TIME_LIMIT),
        loomrun_case("no-program", [], program=[], mentions=("program",)),
        loomrun_case("missing-program", [], program=["/nonexistent/prog"],
                     mentions=("/nonexistent/prog",)),
        loomrun_case("missing-program-on-path", [], program=["no-such-program-xyz"],
                     mentions=("no-such-program-xyz",)),
        loomrun_case("program-not-executable", [], program=["./script.sh"],
                     setup=write("script.sh", "#!/bin/sh\nexit 0\n"), mentions=("script.sh",)),
        loomrun_case("program-is-a-directory", [], program=["./adir"], setup=mkdir("adir"),
                     mentions=("adir",)),
        loomrun_case("program-dash", [], program=["-x"], mentions=("-x",)),
        loomrun_case("program-bad-interpreter", [], program=["./bad.sh"],
                     setup=chain(write("bad.sh", "#!/no/such/interpreter\n"),
                                 lambda d: os.chmod(d / "bad.sh", 0o755)),
                     mentions=("bad.sh", "interpreter", "exec")),
        loomrun_case("rank-exits-3", ["--nproc-per-node", "2"],
                     program=["/bin/sh", "-c", "exit 3"], mentions=("rank", "3")),
        loomrun_case("train-gpt-devices-mismatch", ["--nproc-per-node", "2"],
                     program=["@train_gpt@"] + gpt_args({"--strategy": "ddp",
                                                            "--devices": "3"}),
                     mentions=("--devices",)),
        loomrun_case("train-gpt-ranks-disagree-on-batch", ["--nproc-per-node", "2"],
                     program=["/bin/sh", "-c", "exec @train_gpt@ " + " ".join(
                         gpt_args({"--strategy": "ddp", "--batch": None}))
                         + ' --batch $((2 + RANK))'],
                     mentions=("--batch",)),
        loomrun_case("control:train-gpt-ddp", ["--nproc-per-node", "2"],
                     program=["@train_gpt@"] + gpt_args({"--strategy": "ddp"}),
                     control=True),
    ]
    return cases


# ---------------------------------------------------------------------------------------------
# Family 3: loom-perf
# ---------------------------------------------------------------------------------------------

PERF_BASE = {"-b": "8", "-e": "64", "-n": "2", "-w": "1"}
PERF_BAD = {
    "-b": ["abc", "-1", "", "8X", "99999999999999999999", "1e3", "999999999999999999G"],
    "-e": ["abc", "-1", "", "18446744073709551615", "64Q"],
    "-f": ["1", "0.5", "0", "-2", "nan", "inf", "abc", ""],
    "-i": ["abc", "-1", "1e3"],
    "-n": ["-1", "abc", "", "9999999999999"],
    "-w": ["-1", "abc"],
    "-c": ["2", "-1", "abc"],
    "-d": ["foo", "", "int8", "bool"],
    "-o": ["foo", "", "SUM"],
    "-z": ["3", "-1"],
    "-r": ["-1", "abc"],
    "--backend": ["foo", "", "nccl"],
    "--timeout": ["0", "-1", "nan", "abc"],
    "--np": ["0", "-1", "abc"],
    "--bind": ["numa"],
}
def perf_case(name: str, collective: list[str], overrides: dict, extra: Iterable[str] = (),
              family: str = "perf", **kw) -> Case:
    flags = dict(PERF_BASE)
    flags.update(overrides)
    args = collective + [a for pair in flags.items() for a in pair] + list(extra)
    return Case(family, name, "loom-perf", args, **kw)


def perf_family() -> list[Case]:
    cases = []
    for flag, values in PERF_BAD.items():
        for value in values:
            name = f"{flag.lstrip('-')}={value if value else '<empty>'}"
            mentions = flag_mentions(flag, value)
            collective = ["broadcast"] if flag == "-r" else ["allreduce"]
            cases.append(perf_case(name, collective, {flag: value}, mentions=mentions))
    np2 = {"--np": "2"}
    cases += [
        perf_case("e-below-b", ["allreduce"], {"-b": "1K", "-e": "8"},
                  mentions=("-e", "maxbytes")),
        perf_case("avg-on-int32", ["allreduce"], {"-o": "avg", "-d": "int32"},
                  mentions=("avg", "int32")),
        perf_case("root-outside-world", ["broadcast"], {**np2, "-r": "2"},
                  mentions=("root", "-r", "2")),
        perf_case("root-negative-np2", ["reduce"], {**np2, "-r": "-1"}, mentions=("root", "-r")),
        perf_case("unknown-collective", ["scatter"], {}, mentions=("scatter",)),
        perf_case("empty-collective", [""], {}, mentions=("collective",)),
        perf_case("no-collective", [], {}, mentions=("collective",)),
        perf_case("b-zero", ["allreduce"], {"-b": "0"}, accept=ONE_SIZE),
        perf_case("iters-zero", ["allreduce"], {"-n": "0"}, accept=ITERS_ZERO),
        perf_case("timeout-1e30", ["allreduce"], {"--timeout": "1e30"},
                  mentions=("--timeout",), note="seconds * 1000 overflows int64 milliseconds"),
        perf_case("timeout-inf", ["allreduce"], {"--timeout": "inf"}, mentions=("--timeout",)),
        perf_case("csv-under-a-file", ["allreduce"], {}, ["--csv", "blocker/x.csv"],
                  setup=write("blocker", "x"), mentions=("--csv", "blocker/x.csv")),
        perf_case("json-under-a-file", ["allreduce"], {}, ["--json", "blocker/x.json"],
                  setup=write("blocker", "x"), mentions=("--json", "blocker/x.json")),
        perf_case("control:np2", ["allreduce"], np2, control=True),
    ]
    cases += perf_strategy_cases()
    return cases


STRATEGY_BASE = {"--layers": "1", "--heads": "1", "--embd": "16", "--ctx": "16", "--batch": "2",
                 "--steps": "3", "--warmup": "1"}
STRATEGY_BAD = {
    "--strategy": ["nope", ""],
    "--layers": ["0", "-1"], "--heads": ["0", "3"], "--embd": ["0", "-16"], "--ctx": ["0", "-1"],
    "--vocab": ["0", "-1"], "--batch": ["0", "-1"], "--grad-accum": ["0", "-1"],
    "--steps": ["1", "0", "abc"], "--warmup": ["-5", "100"],
    "--threads": ["0", "-1"], "--precision": ["fp8"], "--param-dtype": ["f64x"],
    "--reduce-dtype": ["i8"], "--sub-group-size": ["0", "-1"],
    "--nvme-buffer-count": ["0", "-1"], "--np": ["0"], "--fsdp-sharding-strategy": ["HALF"],
    "--wrap-policy": ["min_params:abc"],
}
STRATEGY_CONTEXT = {"--sub-group-size": {"--strategy": "deepspeed_stage_3_offload_nvme",
                                         "--nvme-path": "."},
                    "--nvme-buffer-count": {"--strategy": "deepspeed_stage_3_offload_nvme",
                                            "--nvme-path": "."},
                    "--fsdp-sharding-strategy": {"--strategy": "fsdp"},
                    "--wrap-policy": {"--strategy": "fsdp"}}


def perf_strategy_cases() -> list[Case]:
    cases = []
    for flag, values in STRATEGY_BAD.items():
        for value in values:
            flags = {**STRATEGY_BASE, **STRATEGY_CONTEXT.get(flag, {}), flag: value}
            args = ["strategy"] + [a for pair in flags.items() for a in pair]
            name = f"strategy:{flag.lstrip('-')}={value if value else '<empty>'}"
            accept = WARMUP_CLAMPED if (flag, value) == ("--warmup", "100") else None
            cases.append(Case("perf", name, "loom-perf", args, accept=accept,
                              mentions=flag_mentions(flag, value)))
    flags = {**STRATEGY_BASE, "--strategy": "ddp", "--np": "2"}
    cases.append(Case("perf", "strategy:control-ddp-np2", "loom-perf",
                      ["strategy"] + [a for pair in flags.items() for a in pair], control=True))
    return cases


# ---------------------------------------------------------------------------------------------
# Family 4: checkpoints
# ---------------------------------------------------------------------------------------------

def ckpt_consumers() -> list[tuple[str, str, list[str]]]:
    """(name, tool, args) of every reader of a checkpoint copied to ./ck (and ./good)."""
    return [
        ("inspect", "loom-ckpt", ["inspect", "ck"]),
        ("verify", "loom-ckpt", ["verify", "ck"]),
        ("diff", "loom-ckpt", ["diff", "good", "ck"]),
        ("convert", "loom-ckpt", ["convert", "ck", "out", "--to", "sharded", "--world-size", "2"]),
        ("resume", "train_gpt", gpt_args({"--steps": "4"}, ["--resume", "ck"])),
    ]


@dataclass
class Corruption:
    name: str
    setup: Setup
    mentions: tuple[str, ...]
    # consumer -> why accepting this corruption is fine for it (it does not read that part)
    accept: dict[str, Reason] = field(default_factory=dict)


# A damaged safetensors header is refused by every reader now, inspect included (every
# reader takes index.json only when the files' headers give exactly it): the old HEADER_ONLY
# reasons ("inspect reads index.json and meta.json only", "reads the tensors through
# index.json") are gone. Damaged tensor data is still read by inspect, which reads no data.
DATA_ONLY = {"inspect": INSPECT_NO_DATA}


# diff's exit 1 with "the checkpoints differ" on stdout names the damage as a difference.
DIFF_DETECTS = {"diff": ("the checkpoints differ",)}


def data_file_corruptions(step: Path, files: list[str]) -> list[Corruption]:
    out = []
    for name in files:
        path = step / name
        size, end = path.stat().st_size, header_end(path)
        mentions = (name,)
        for cut in sorted({0, 7, 8, end - 1, end, end + 100, size - 1}):
            out.append(Corruption(f"{name}:truncated-at-{cut}", truncate(f"ck/{name}", cut),
                                  mentions))
        out.append(Corruption(f"{name}:one-byte-appended", append(f"ck/{name}", b"\0"), mentions))
        for at in (0, 5):  # the header length
            out.append(Corruption(f"{name}:flip-length-byte-{at}", flip(f"ck/{name}", at),
                                  mentions))
        for at in (9, end // 2, end - 2):  # the header's JSON and its padding
            out.append(Corruption(f"{name}:flip-header-byte-{at}", flip(f"ck/{name}", at),
                                  mentions))
        for at in (end, (end + size) // 2, size - 1):  # tensor data
            out.append(Corruption(f"{name}:flip-data-byte-{at}", flip(f"ck/{name}", at),
                                  mentions, DATA_ONLY))
        out.append(Corruption(f"{name}:removed", remove(f"ck/{name}"), mentions))
    return out


T = "h.0.ln_1.weight"  # a small tensor every checkpoint has ([16], one shard)


def first_shard(ix: dict) -> dict:
    return ix["tensors"][T]["shards"][0]


def set_in(path: list, value) -> Callable[[dict], None]:
    def mutate(obj: dict) -> None:
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return mutate


def drop(path: list) -> Callable[[dict], None]:
    def mutate(obj: dict) -> None:
        for key in path[:-1]:
            obj = obj[key]
        del obj[path[-1]]
    return mutate


def shard_set(key: str, value) -> Callable[[dict], None]:
    def mutate(ix: dict) -> None:
        first_shard(ix)[key] = value
    return mutate


def shard_outside_directory(ix: dict) -> None:
    """Points a shard at ../good/<its file>: same bytes, outside the checkpoint."""
    shard = first_shard(ix)
    outside = "../good/" + shard["file"]
    ix["files"][outside] = ix["files"][shard["file"]]
    shard["file"] = outside


def shard_past_end(ix: dict) -> None:
    shard = first_shard(ix)
    length = shard["bytes"][1] - shard["bytes"][0]
    end = ix["files"][shard["file"]]
    shard["bytes"] = [end - length // 2, end - length // 2 + length]


def box_shard(offsets, sizes) -> Callable[[dict], None]:
    def mutate(ix: dict) -> None:
        shard = first_shard(ix)
        shard.pop("elements", None)
        shard["offsets"], shard["sizes"] = offsets, sizes
    return mutate


def duplicate_key_text(ix: dict) -> str:
    """The index with tensor T's key twice: first with another shape, then as saved (a JSON
    parser that keeps the last value sees a valid index)."""
    text = json.dumps(ix, indent=1)
    entry = json.dumps({**ix["tensors"][T], "shape": [4, 4]})
    return text.replace('"tensors": {', '"tensors": {"' + T + '": ' + entry + ",", 1)


INDEX_MUTATIONS: list[tuple[str, Callable[[dict], object]]] = [
    ("not-json", lambda ix: "{ this is not json"),
    ("empty", lambda ix: ""),
    ("null", lambda ix: "null"),
    ("array", lambda ix: "[]"),
    ("number", lambda ix: "42"),
    ("truncated-text", lambda ix: json.dumps(ix, indent=1)[:200]),
    ("trailing-garbage", lambda ix: json.dumps(ix) + " }}"),
    ("format-wrong", set_in(["format"], "something-else")),
    ("format-missing", drop(["format"])),
    ("version-2", set_in(["version"], 2)),
    ("version-string", set_in(["version"], "1")),
    ("files-missing", drop(["files"])),
    ("files-list", set_in(["files"], [])),
    ("files-size-string", lambda ix: ix["files"].update({k: "big" for k in ix["files"]})),
    ("files-size-negative", lambda ix: ix["files"].update({k: -1 for k in ix["files"]})),
    ("tensors-missing", drop(["tensors"])),
    ("tensors-list", set_in(["tensors"], [])),
    ("tensors-empty", set_in(["tensors"], {})),
    ("tensor-removed", drop(["tensors", T])),
    ("tensor-extra", lambda ix: ix["tensors"].update({"extra.weight": ix["tensors"][T]})),
    ("tensor-duplicate-key", duplicate_key_text),
    ("dtype-missing", drop(["tensors", T, "dtype"])),
    ("dtype-unknown", set_in(["tensors", T, "dtype"], "f33")),
    ("dtype-number", set_in(["tensors", T, "dtype"], 5)),
    ("dtype-changed", set_in(["tensors", T, "dtype"], "f64")),
    ("shape-string", set_in(["tensors", T, "shape"], "abc")),
    ("shape-negative", set_in(["tensors", T, "shape"], [-4, -4])),
    ("shape-overflow", set_in(["tensors", T, "shape"], [2 ** 40, 2 ** 40])),
    ("shape-changed", set_in(["tensors", T, "shape"], [4, 4])),
    ("shards-empty", set_in(["tensors", T, "shards"], [])),
    ("shards-not-list", set_in(["tensors", T, "shards"], 7)),
    ("shard-file-missing-key", lambda ix: first_shard(ix).pop("file")),
    ("shard-file-unlisted", shard_set("file", "rank-00099.safetensors")),
    ("shard-file-outside-dir", shard_outside_directory),
    ("shard-file-absolute", shard_set("file", "/etc/passwd")),
    ("elements-reversed", shard_set("elements", [16, 0])),
    ("elements-negative", shard_set("elements", [-16, 0])),
    ("elements-huge", shard_set("elements", [0, 2 ** 62])),
    ("elements-one-value", shard_set("elements", [0])),
    ("bytes-past-file-end", shard_past_end),
    ("bytes-in-header", shard_set("bytes", [0, 64])),
    ("bytes-negative", shard_set("bytes", [-64, 0])),
    ("bytes-strings", shard_set("bytes", ["0", "64"])),
    ("block-bytes-zero", shard_set("block_bytes", 0)),
    ("block-bytes-one", shard_set("block_bytes", 1)),
    ("block-bytes-negative", shard_set("block_bytes", -1)),
    ("xxh3-not-hex", shard_set("xxh3", ["zzzzzzzzzzzzzzzz"])),
    ("xxh3-empty", shard_set("xxh3", [])),
    ("xxh3-wrong", shard_set("xxh3", ["0000000000000000"])),
    ("xxh3-number", shard_set("xxh3", [5])),
    ("box-outside-shape", box_shard([8], [16])),
    ("box-overflow", box_shard([2 ** 63 - 1], [2])),
    ("box-wrong-rank", box_shard([0, 0], [16, 1])),
    ("box-sizes-without-offsets", lambda ix: first_shard(ix).update({"sizes": [16]})),
]
# No index mutation is accepted any more: an extra tensor none of the files holds
# (`tensor-extra`) is refused by every reader, and inspect refuses shard byte ranges outside
# the file or in its header, negative ones and a wrong checksum list (`bytes-*`, `xxh3-wrong`).

META_MUTATIONS: list[tuple[str, Callable[[dict], object]]] = [
    ("not-json", lambda m: "{ nope"),
    ("empty", lambda m: ""),
    ("array", lambda m: "[]"),
    ("format-wrong", set_in(["format"], "other")),
    ("version-1", set_in(["version"], 1)),
    ("version-3", set_in(["version"], 3)),
    ("version-string", set_in(["version"], "2")),
    ("step-negative", set_in(["step"], -5)),
    ("step-string", set_in(["step"], "2")),
    ("step-float", set_in(["step"], 1e30)),
    ("step-above-run", set_in(["step"], 99)),
    ("step-missing", drop(["step"])),
    ("world-size-zero", set_in(["world_size"], 0)),
    ("world-size-string", set_in(["world_size"], "two")),
    ("model-missing", drop(["model"])),
    ("model-heads-string", set_in(["model", "heads"], "1")),
    ("model-heads-zero", set_in(["model", "heads"], 0)),
    ("optimizer-sgd", set_in(["optimizer"], "sgd")),
    ("optimizer-number", set_in(["optimizer"], 5)),
    ("strategy-number", set_in(["strategy"], 5)),
    ("checkpoint-format-weird", set_in(["checkpoint_format"], "zip")),
    ("batch-changed", set_in(["batch"], 99)),
]
META_KEYS = {"format": "format", "version": "version", "step": "step", "world": "world_size",
             "model": "model", "optimizer": "optimizer", "strategy": "strategy",
             "checkpoint": "checkpoint_format", "batch": "batch"}
# The meta.json mutations some readers accept, with each reader's reason. Every reader checks
# every field's type and range (docs/checkpoints.md), so `strategy-number`, `world-size-zero`,
# `world-size-string` and `checkpoint-format-weird` (once accepted as "informational
# fields"), and the format, version, step, model and type mutations, are refused by all of
# them. What stays accepted is well-typed values that disagree with the state: inspect shows
# them; convert copies the batch; resume takes another batch. (Since 2026-12-02 verify,
# convert and resume refuse a step or an optimizer that is not the state's.)
META_ACCEPT: dict[str, dict[str, Reason]] = {
    # verify, convert and resume compare the step with the optimizer state's own count, and
    # the optimizer's name with its state (AdamW's moments)
    "step-above-run": {"inspect": inspect_shows(r"^  step 99, strategy")},
    "optimizer-sgd": {"inspect": inspect_shows(r"optimizer sgd,")},
    "batch-changed": {"inspect": inspect_shows(r"^  step 2, strategy single_device"),
                      "verify": VERIFY_TYPES_ONLY, "convert": convert_copies("batch", 99),
                      "resume": BATCH_MAY_CHANGE},
}


def meta_corruptions() -> list[Corruption]:
    out = []
    for name, mutate in META_MUTATIONS:
        accept = {"diff": DIFF_TENSORS, **META_ACCEPT.get(name, {})}
        key = META_KEYS.get(name.split("-")[0])
        out.append(Corruption(f"meta:{name}", edit_json("ck/meta.json", mutate),
                              ("meta.json",) + ((key,) if key else ()), accept))
    return out


def directory_corruptions() -> list[Corruption]:
    return [
        Corruption("COMMITTED-removed", remove("ck/COMMITTED"), ("COMMITTED", "committed")),
        Corruption("index-removed", remove("ck/index.json"), ("index.json",)),
        Corruption("meta-removed", remove("ck/meta.json"), ("meta.json",),
                   {"diff": DIFF_TENSORS}),
        Corruption("stray-file-added", write("ck/notes.txt", "hello"), (), STRAY_IGNORED),
        Corruption("index-truncated-1", truncate("ck/index.json", 1), ("index.json",)),
        Corruption("index-flip-byte-100", flip("ck/index.json", 100), ("index.json",)),
    ]


def ckpt_family(fx: Fixtures) -> list[Case]:
    corruptions = (data_file_corruptions(fx.full, ["model.safetensors", "rank-00000.safetensors"])
                   + [Corruption(f"index:{n}", edit_json("ck/index.json", m),
                                 ("index.json", T)) for n, m in INDEX_MUTATIONS]
                   + meta_corruptions() + directory_corruptions())
    cases = []
    for c in corruptions:
        for consumer, tool, args in ckpt_consumers():
            cases.append(Case("ckpt", f"full:{c.name}:{consumer}", tool, args,
                              setup=chain(copy_in(fx.full, "good"), copy_in(fx.full, "ck"),
                                          c.setup),
                              setup_note="ck and good: copies of a full-format checkpoint "
                                         "(single_device, 2 steps); ck then damaged",
                              accept=c.accept.get(consumer),
                              mentions=c.mentions + DIFF_DETECTS.get(consumer, ()),
                              category=f"full:{corruption_kind(c.name)}:{consumer}"))
    cases += sharded_ckpt_cases(fx)
    cases += meta_from_another_step_cases(fx)
    cases += [Case("ckpt", f"path:{n}:{sub}", "loom-ckpt", [sub, p], setup=s, mentions=m)
              for n, p, s, m in (("missing", "nothere", None, ("nothere",)),
                                 ("regular-file", "afile", write("afile", "x"), ("afile",)),
                                 ("empty-dir", "adir", mkdir("adir"), ("adir",)),
                                 ("empty-string", "", None, ("checkpoint",)))
              for sub in ("inspect", "verify")]
    cases += [
        Case("ckpt", "convert:world-size-0", "loom-ckpt",
             ["convert", "ck", "out", "--to", "sharded", "--world-size", "0"],
             setup=copy_in(fx.full, "ck"), mentions=("--world-size", "world")),
        Case("ckpt", "convert:world-size-negative", "loom-ckpt",
             ["convert", "ck", "out", "--to", "sharded", "--world-size", "-3"],
             setup=copy_in(fx.full, "ck"), mentions=("--world-size", "world", "-3")),
        Case("ckpt", "convert:sharded-without-world-size", "loom-ckpt",
             ["convert", "ck", "out", "--to", "sharded"],
             setup=copy_in(fx.full, "ck"), mentions=("--world-size", "world")),
        Case("ckpt", "convert:target-under-a-file", "loom-ckpt",
             ["convert", "ck", "blocker/out", "--to", "full"],
             setup=chain(copy_in(fx.full, "ck"), write("blocker", "x")),
             mentions=("blocker/out", "blocker")),
        Case("ckpt", "convert:onto-itself", "loom-ckpt", ["convert", "ck", "ck", "--to", "full"],
             setup=copy_in(fx.full, "ck"), mentions=("ck",)),
        Case("ckpt", "convert:bad-to", "loom-ckpt", ["convert", "ck", "out", "--to", "zip"],
             setup=copy_in(fx.full, "ck"), mentions=("--to", "zip")),
        Case("ckpt", "unknown-subcommand", "loom-ckpt", ["repair", "ck"], mentions=("repair",)),
        Case("ckpt", "control:verify", "loom-ckpt", ["verify", "ck"],
             setup=copy_in(fx.full, "ck"), control=True),
    ]
    return cases


def sharded_ckpt_cases(fx: Fixtures) -> list[Case]:
    rank1 = "rank-00001.safetensors"
    path = fx.sharded / rank1
    size, end = path.stat().st_size, header_end(path)
    corruptions = [
        Corruption("rank1-truncated-mid", truncate(f"ck/{rank1}", size // 2), (rank1,)),
        Corruption("rank1-flip-data", flip(f"ck/{rank1}", (end + size) // 2), (rank1,),
                   DATA_ONLY),
        Corruption("rank1-flip-header", flip(f"ck/{rank1}", end // 2), (rank1,)),
        Corruption("rank1-removed", remove(f"ck/{rank1}"), (rank1,)),
        Corruption("index-lost-rank1-shards", edit_json("ck/index.json", drop_file_shards(rank1)),
                   ("index.json", "shard")),
    ]
    consumers = ckpt_consumers() + [
        ("resume-ddp2", "train_gpt",
         gpt_args({"--steps": "4", **DDP2}, ["--resume", "ck"]))]
    cases = []
    for c in corruptions:
        for consumer, tool, args in consumers:
            accept = c.accept.get("resume" if consumer == "resume-ddp2" else consumer)
            cases.append(Case("ckpt", f"sharded:{c.name}:{consumer}", tool, args,
                              setup=chain(copy_in(fx.sharded, "good"), copy_in(fx.sharded, "ck"),
                                          c.setup),
                              setup_note="ck and good: copies of a sharded checkpoint "
                                         "(ddp_spawn on 2 ranks); ck then damaged",
                              accept=accept, mentions=c.mentions + DIFF_DETECTS.get(consumer, ()),
                              category=f"sharded:{consumer}"))
    return cases


def corruption_kind(name: str) -> str:
    """model.safetensors, rank-00000.safetensors, index, meta, or dir (the directory's)."""
    return name.split(":")[0] if ":" in name else "dir"


def xxh3_hex(data: bytes) -> str:
    """XXH3-64 as the index writes it (16 lowercase hex digits), from libxxhash."""
    import ctypes
    lib = ctypes.CDLL("libxxhash.so.0")
    lib.XXH3_64bits.restype = ctypes.c_uint64
    lib.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return f"{lib.XXH3_64bits(data, len(data)):016x}"


def restamp_meta(step: Path) -> None:
    """Where the checkpoint records meta.json's size or checksum (index.json's "files", or a
    key naming meta and a checksum, in index.json or a JSON COMMITTED), rewrites them for
    the meta.json now there: the copied meta.json is then consistent with its records, and
    only its content (another step's) is wrong."""
    meta = (step / "meta.json").read_bytes()

    def fix(obj) -> bool:
        changed = False
        if isinstance(obj, dict):
            for key, value in obj.items():
                low = key.lower()
                if key == "meta.json" and isinstance(value, int):
                    obj[key], changed = len(meta), True
                elif "meta" in low and any(h in low for h in ("xxh3", "checksum", "hash")) \
                        and isinstance(value, str):
                    obj[key], changed = xxh3_hex(meta), True
                else:
                    changed |= fix(value)
        elif isinstance(obj, list):
            for value in obj:
                changed |= fix(value)
        return changed

    for name in ("index.json", "COMMITTED"):
        try:
            obj = json.loads((step / name).read_text())
        except (OSError, ValueError):
            continue
        if fix(obj):
            (step / name).write_text(json.dumps(obj, indent=1))


def meta_from_another_step_cases(fx: "Fixtures") -> list[Case]:
    """D: a run saving every step (steps 1-3); step 3's meta.json is step 1's, its recorded
    size or checksum (if any) made to agree. Reading it as step 3 would train from step 1's
    position with step 3's weights."""
    def setup(d: Path) -> None:
        copy_in(fx.steps, "D")(d)
        shutil.copy(d / "D/step-00000001/meta.json", d / "D/step-00000003/meta.json")
        restamp_meta(d / "D/step-00000003")
    names_both = line_has(r"\b0*1\b.*\b0*3\b|\b0*3\b.*\b0*1\b")
    common = dict(setup=setup, mentions=("step",), expect=names_both,
                  expect_note="the error line names both steps, 1 and 3",
                  setup_note="D: checkpoints of steps 1-3; step-00000003/meta.json copied "
                             "from step-00000001 (its records made to agree)", ci=True,
                  category="meta-from-another-step")
    return [Case("ckpt", "meta-from-another-step:verify", "loom-ckpt",
                 ["verify", "D/step-00000003"], **common),
            gpt("ckpt", "meta-from-another-step:resume-auto", {"--steps": "5"},
                extra=["--checkpoint-dir", "D", "--resume", "auto"], **common)]


def drop_file_shards(file: str) -> Callable[[dict], None]:
    def mutate(ix: dict) -> None:
        for entry in ix["tensors"].values():
            entry["shards"] = [s for s in entry["shards"] if s["file"] != file]
    return mutate


# ---------------------------------------------------------------------------------------------
# Family 5: safetensors files
# ---------------------------------------------------------------------------------------------
# A variant is build(header, data, pack) -> file bytes, where pack(header, data, length=None)
# is safetensors_bytes, or for a checkpoint's model.safetensors the same padded to the
# original header's length (index.json's byte offsets then still point at the same data).

Pack = Callable[..., bytes]
Build = Callable[[dict, bytes, Pack], bytes]


def entry_edit(name: str, key: str, value) -> Build:
    def build(h: dict, data: bytes, pack: Pack) -> bytes:
        h[name][key] = value
        return pack(h, data)
    return build


def header_edit(mutate: Callable[[dict], None]) -> Build:
    def build(h: dict, data: bytes, pack: Pack) -> bytes:
        mutate(h)
        return pack(h, data)
    return build


def raw_header(text: bytes) -> Build:
    return lambda h, data, pack: pack(text, data)


def lying_length(length: int) -> Build:
    return lambda h, data, pack: pack(h, data, length=length)


def overlapping(h: dict, data: bytes, pack: Pack) -> bytes:
    """ln_1.bias's offsets made ln_1.weight's (same size): two tensors share bytes."""
    h["h.0.ln_1.bias"]["data_offsets"] = h["h.0.ln_1.weight"]["data_offsets"]
    return pack(h, data)


def with_gap(h: dict, data: bytes, pack: Pack) -> bytes:
    """64 unreferenced bytes at the end of the data."""
    return pack(h, data + b"\0" * 64)


def renamed(old: str, new: str) -> Build:
    def build(h: dict, data: bytes, pack: Pack) -> bytes:
        h[new] = h.pop(old)
        return pack(h, data)
    return build


def extra_tensor(name: str) -> Build:
    def build(h: dict, data: bytes, pack: Pack) -> bytes:
        h[name] = dict(h["h.0.ln_1.weight"])
        return pack(h, data)
    return build


def nan_weights(h: dict, data: bytes, pack: Pack) -> bytes:
    begin, end = h["wte.weight"]["data_offsets"]
    nan = struct.pack("<f", float("nan"))
    return pack(h, data[:begin] + nan * ((end - begin) // 4) + data[end:])


def metadata(key: str, value) -> Build:
    def build(h: dict, data: bytes, pack: Pack) -> bytes:
        h.setdefault("__metadata__", {})[key] = value
        return pack(h, data)
    return build


def duplicate_entry(h: dict, data: bytes, pack: Pack) -> bytes:
    text = compact_json(h)
    entry = compact_json(h["h.0.ln_1.bias"])
    return pack(text.replace("{", '{"h.0.ln_1.bias":' + entry + ",", 1).encode(), data)


def safetensors_variants(size: int) -> list[tuple[str, Build, tuple, Optional[str]]]:
    """(name, build, mentions, accept Reason or "control") for a file of `size` bytes."""
    w = "wte.weight"
    lim = ("safetensors",)
    return [
        ("empty-file", lambda h, d, pack: b"", lim, None),
        ("four-bytes", lambda h, d, pack: b"\x08\0\0\0", lim, None),
        ("length-only", lambda h, d, pack: struct.pack("<Q", 0), lim, None),
        ("length-past-file", lying_length(size + 1000), lim, None),
        ("length-2^63", lying_length(2 ** 63), lim, None),
        ("length-2^64-1", lying_length(2 ** 64 - 1), lim, None),
        ("length-1TiB", lying_length(2 ** 40), lim, None),
        ("length-short", lying_length(16), lim, None),
        ("header-not-json", raw_header(b"hello world"), lim, None),
        ("header-array", raw_header(b"[1, 2, 3]"), lim, None),
        ("header-string", raw_header(b'"just a string"'), lim, None),
        ("header-bad-utf8", raw_header(b'{"\xff\xfe": 1}'), lim, None),
        ("header-nul", raw_header(b'{"a\x00b": {}}'), lim, None),
        ("header-cut", lambda h, d, pack: pack(compact_json(h).encode()[:300], d), lim, None),
        ("dtype-F33", entry_edit(w, "dtype", "F33"), ("F33",), None),
        ("dtype-lowercase", entry_edit(w, "dtype", "f32"), ("f32", "dtype"), None),
        ("dtype-BOOL", entry_edit(w, "dtype", "BOOL"), ("BOOL",), None),
        ("dtype-number", entry_edit(w, "dtype", 5), ("dtype",), None),
        ("dtype-I32-same-bytes", entry_edit(w, "dtype", "I32"), ("I32", "dtype", w),
         I32_CONVERTED),
        ("shape-string", entry_edit(w, "shape", "abc"), ("shape",), None),
        ("shape-negative", entry_edit(w, "shape", [-256, -16]), ("shape",), None),
        ("shape-2^63", entry_edit(w, "shape", [2 ** 63]), ("shape",), None),
        ("shape-overflow", entry_edit(w, "shape", [2 ** 32, 2 ** 32]), ("shape",), None),
        ("shape-float", entry_edit(w, "shape", [256.5, 16]), ("shape",), None),
        ("shape-mismatch", entry_edit(w, "shape", [256, 17]), ("shape", w), None),
        ("shape-transposed", entry_edit(w, "shape", [16, 256]), (w, "shape"), None),
        ("offsets-negative", entry_edit(w, "data_offsets", [-8, 16376]), ("data_offsets",), None),
        ("offsets-reversed", entry_edit(w, "data_offsets", [16384, 0]), ("data_offsets",), None),
        ("offsets-past-buffer", entry_edit(w, "data_offsets", [size, size + 16384]),
         ("data_offsets",), None),
        ("offsets-2^64", entry_edit(w, "data_offsets", [0, 2 ** 64 + 16384]),
         ("data_offsets",), None),
        ("offsets-one-value", entry_edit(w, "data_offsets", [0]), ("data_offsets",), None),
        ("offsets-strings", entry_edit(w, "data_offsets", ["0", "16384"]), ("data_offsets",),
         None),
        ("overlapping-tensors", overlapping, ("overlap", "h.0.ln_1"), None),
        ("unreferenced-trailing-bytes", with_gap, ("safetensors",), None),
        ("duplicate-key", duplicate_entry, ("twice", "h.0.ln_1.bias"), None),
        ("entry-missing-dtype", header_edit(lambda h: h[w].pop("dtype")), ("dtype",), None),
        ("entry-not-object", header_edit(lambda h: h.update({w: [1, 2]})), (w,), None),
        ("metadata-list", header_edit(lambda h: h.update({"__metadata__": [1]})),
         ("__metadata__",), None),
        ("metadata-value-number", metadata("loom.heads", 1), ("loom.heads", "__metadata__"),
         None),
        ("loom.heads-abc", metadata("loom.heads", "abc"), ("loom.heads", "heads", "abc"), None),
        ("loom.heads-0", metadata("loom.heads", "0"), ("heads",), None),
        ("loom.heads--1", metadata("loom.heads", "-1"), ("heads",), None),
        ("loom.heads-3", metadata("loom.heads", "3"), ("heads",), None),
        ("loom.heads-huge", metadata("loom.heads", "99999999999999999999"),
         ("loom.heads", "heads", "99999999999999999999"), None),
        ("wte-missing", renamed(w, "wte_renamed.weight"), ("wte",), None),
        ("wte-1d", entry_edit(w, "shape", [4096]), ("wte",), None),
        ("block-index-huge", renamed("h.0.ln_1.weight", "h.99999999999999999999.ln_1.weight"),
         ("h.99999999999999999999", "99999999999999999999"), None),
        ("block-gap", renamed("h.0.ln_1.weight", "h.5.ln_1.weight"), ("h.", "missing"), None),
        ("unknown-extra-tensor", extra_tensor("foo.weight"), ("foo.weight",), None),
        # well-formed, and the NaN weights make the first gradient norm NaN: refused as a
        # diverged run naming step 1 (it was accepted as "values, not a format error")
        ("nan-weights", nan_weights, ("nan", "diverged"), None),
        ("control:as-saved", lambda h, d, pack: pack(h, d), (), "control"),
    ]


# The variants also written as a checkpoint's model.safetensors (for loom-ckpt verify).
CKPT_MODEL_VARIANTS = ("empty-file", "length-past-file", "length-2^63", "length-short",
                       "header-not-json", "header-bad-utf8", "dtype-F33", "shape-mismatch",
                       "offsets-past-buffer", "overlapping-tensors", "duplicate-key")


def safetensors_family(fx: Fixtures) -> list[Case]:
    cases = []
    header, data = read_safetensors(fx.init)
    no_model_flags = {k: None for k in ("--layers", "--heads", "--embd", "--ctx")}
    for name, build, mentions, accept in safetensors_variants(fx.init.stat().st_size):
        content = build(copy.deepcopy(header), data, safetensors_bytes)
        control = accept == "control"
        cases.append(gpt("safetensors", f"init:{name}", no_model_flags,
                         extra=["--init", "w.safetensors"], setup=write("w.safetensors", content),
                         setup_note="w.safetensors: train_gpt --save output, then rewritten",
                         mentions=mentions + ("w.safetensors",), control=control,
                         accept=None if control else accept))
    model = fx.full / "model.safetensors"
    header, data = read_safetensors(model)
    pack = padded_pack(header_end(model) - 8)
    for name, build, _, _ in safetensors_variants(model.stat().st_size):
        if name in CKPT_MODEL_VARIANTS:
            cases.append(ckpt_model_case(fx, name, build(copy.deepcopy(header), data, pack)))
    return cases


def padded_pack(header_length: int) -> Pack:
    """safetensors_bytes with the header padded with spaces to `header_length` bytes."""
    def pack(header: dict | bytes, data: bytes, length: Optional[int] = None) -> bytes:
        text = header if isinstance(header, bytes) else compact_json(header).encode()
        text += b" " * max(0, header_length - len(text))
        return safetensors_bytes(text, data, length)
    return pack


def ckpt_model_case(fx: Fixtures, name: str, content: bytes) -> Case:
    """`content` as model.safetensors of a copy of the full checkpoint, the index's recorded
    size updated so that only the file's own validity is in question."""
    def fix_size(ix: dict) -> None:
        ix["files"]["model.safetensors"] = len(content)
    return Case("safetensors", f"ckpt-model:{name}:verify", "loom-ckpt", ["verify", "ck"],
                setup=chain(copy_in(fx.full, "ck"), write("ck/model.safetensors", content),
                            edit_json("ck/index.json", fix_size)),
                setup_note="ck: a full checkpoint whose model.safetensors is replaced "
                           "(header padded to its old length, index.json's size updated)",
                mentions=("model.safetensors",))


# ---------------------------------------------------------------------------------------------
# Family 6: environment
# ---------------------------------------------------------------------------------------------

SHM_VARS = ("LOOM_SHM_SLICE_BYTES", "LOOM_SHM_ONE_SHOT_BYTES", "LOOM_SHM_CHANNEL_BYTES")
SHM_BAD = ["abc", "0", "-1", " 5", "1e3", "18446744073709551615", "99999999999999999999",
           "1099511627776000"]
SHM_LEGIT: dict[tuple[str, str], Reason] = {}  # (variable, value) -> why it may be accepted


def env_family(tools: dict[str, Path]) -> list[Case]:
    cases = []
    for var in SHM_VARS:
        for value in SHM_BAD:
            accept = SHM_LEGIT.get((var, value))
            cases.append(gpt("env", f"{var}={value!r}:ddp_spawn", DDP2, env={var: value},
                             mentions=(var,), accept=accept))
        cases.append(perf_case(f"{var}=-1:loom-perf", ["allreduce"], {"--np": "2"},
                               env={var: "-1"}, mentions=(var,), family="env"))
        cases.append(gpt("env", f"{var}=1:ddp_spawn", DDP2, env={var: "1"},
                         accept=SHM_TINY_SIZE))
    cases += rank_env_cases() + loom_var_cases()
    return cases


def rank_env_cases() -> list[Case]:
    ddp = {"--strategy": "ddp"}
    secret = {"LOOM_STORE_SECRET": "s3cret", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517"}
    rows = [  # (name, env, mentions)
        ("RANK-abc", {"RANK": "abc", "WORLD_SIZE": "2"}, ("RANK",)),
        ("RANK-equals-WORLD_SIZE", {"RANK": "2", "WORLD_SIZE": "2"}, ("RANK",)),
        ("RANK-negative", {"RANK": "-1", "WORLD_SIZE": "2"}, ("RANK",)),
        ("RANK-float", {"RANK": "0.5", "WORLD_SIZE": "1"}, ("RANK",)),
        ("RANK-empty", {"RANK": "", "WORLD_SIZE": "1"}, ("RANK",)),
        ("WORLD_SIZE-zero", {"RANK": "0", "WORLD_SIZE": "0"}, ("WORLD_SIZE",)),
        ("WORLD_SIZE-abc", {"RANK": "0", "WORLD_SIZE": "abc"}, ("WORLD_SIZE",)),
        ("WORLD_SIZE-overflow", {"RANK": "0", "WORLD_SIZE": "99999999999"}, ("WORLD_SIZE",)),
        ("LOCAL_RANK-above-local-world", {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "5",
                                          "LOCAL_WORLD_SIZE": "1"}, ("LOCAL_RANK",)),
        ("LOCAL_WORLD_SIZE-above-world", {"RANK": "0", "WORLD_SIZE": "1",
                                          "LOCAL_WORLD_SIZE": "3"}, ("LOCAL_WORLD_SIZE",)),
        ("LOCAL_RANK-abc", {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "abc"},
         ("LOCAL_RANK",)),
        ("GROUP_RANK-abc", {"RANK": "0", "WORLD_SIZE": "1", "GROUP_RANK": "abc"},
         ("GROUP_RANK",)),
        ("MASTER_PORT-99999", {"RANK": "0", "WORLD_SIZE": "2", **secret, "MASTER_PORT": "99999"},
         ("MASTER_PORT",)),
        ("MASTER_PORT-abc", {"RANK": "0", "WORLD_SIZE": "2", **secret, "MASTER_PORT": "abc"},
         ("MASTER_PORT",)),
        ("MASTER_ADDR-empty", {"RANK": "0", "WORLD_SIZE": "2", **secret, "MASTER_ADDR": ""},
         ("MASTER_ADDR",)),
        ("no-secret-world-2", {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                               "MASTER_PORT": "29518"}, ("LOOM_STORE_SECRET",)),
        ("LOOM_STORE_PORT-abc", {"RANK": "0", "WORLD_SIZE": "2", **secret,
                                 "LOOM_STORE_PORT": "abc"}, ("LOOM_STORE_PORT",)),
        ("LOOM_RESTART_COUNT-abc", {"RANK": "0", "WORLD_SIZE": "1",
                                    "LOOM_RESTART_COUNT": "abc"}, ("LOOM_RESTART_COUNT",)),
        ("LOOM_CLUSTER_ENV-unknown", {"LOOM_CLUSTER_ENV": "kubernetes"}, ("LOOM_CLUSTER_ENV",)),
        ("LOOM_CLUSTER_ENV-slurm-without-vars", {"LOOM_CLUSTER_ENV": "slurm"}, ("SLURM",)),
        ("SLURM_TASKS_PER_NODE-garbage", {"LOOM_CLUSTER_ENV": "slurm", "SLURM_PROCID": "0",
                                          "SLURM_NTASKS": "1", "SLURM_NODEID": "0",
                                          "SLURM_TASKS_PER_NODE": "x(y"},
         ("SLURM_TASKS_PER_NODE",)),
        ("OMPI-rank-abc", {"LOOM_CLUSTER_ENV": "openmpi", "OMPI_COMM_WORLD_RANK": "abc",
                           "OMPI_COMM_WORLD_SIZE": "1"}, ("OMPI_COMM_WORLD_RANK",)),
    ]
    cases = [gpt("env", f"rank-env:{n}", ddp, env=e, mentions=m) for n, e, m in rows]
    cases += [
        gpt("env", "rank-env:single-device-ignores-RANK-abc", env={"RANK": "abc",
                                                                   "WORLD_SIZE": "2"},
            accept=RANK_ENV_UNREAD),
        # half a rank environment: a launcher that set one of the two is broken, and a rank
        # that made up the other would join the wrong job or none
        gpt("env", "rank-env:RANK-without-WORLD_SIZE", ddp, env={"RANK": "1"},
            mentions=("WORLD_SIZE",), ci=True),
        gpt("env", "rank-env:WORLD_SIZE-without-RANK", ddp, env={"WORLD_SIZE": "2"},
            mentions=("RANK",), expect=line_has(r"(?<![A-Z_])RANK(?![A-Z_])"),
            expect_note="the error line names RANK (in capitals, on its own)", ci=True),
        gpt("env", "rank-env:control-ddp-world-1", ddp, env={"RANK": "0", "WORLD_SIZE": "1"},
            control=True),
        gpt("env", "rank-env:ddp_spawn-under-WORLD_SIZE-abc", DDP2, env={"WORLD_SIZE": "abc",
                                                                         "RANK": "0"},
            mentions=("WORLD_SIZE",)),
    ]
    return cases


def loom_var_cases() -> list[Case]:
    store_port_loomrun = ["--nproc-per-node", "2", "--master-port", "0",
                          "@train_gpt@"] + gpt_args({"--strategy": "ddp"})
    cases = [
        gpt("env", "LOOM_DEBUG=verbose", DDP2, env={"LOOM_DEBUG": "verbose"},
            mentions=("LOOM_DEBUG",), note="ignored value"),
        gpt("env", "LOOM_DEBUG=DETAIL", DDP2, env={"LOOM_DEBUG": "DETAIL"},
            mentions=("LOOM_DEBUG",), note="ignored value"),
        gpt("env", "LOOM_FLIGHT_RECORDER=abc", DDP2, env={"LOOM_FLIGHT_RECORDER": "abc"},
            mentions=("LOOM_FLIGHT_RECORDER",), note="ignored value"),
        # refused at start-up: it used to be accepted as "only used when a collective fails",
        # which left a job whose first failure would write no dump
        gpt("env", "LOOM_FLIGHT_RECORDER_DIR=under-a-file", DDP2,
            env={"LOOM_FLIGHT_RECORDER_DIR": "blocker/dir"}, setup=write("blocker", "x"),
            mentions=("LOOM_FLIGHT_RECORDER_DIR",), expect=output_lacks(r"^step 1/"),
            expect_note="refused before the first step", ci=True),
        Case("env", "LOOM_STORE_PORT=abc:loomrun", "loomrun", store_port_loomrun,
             env={"LOOM_STORE_PORT": "abc"}, mentions=("LOOM_STORE_PORT",)),
        Case("env", "LOOM_STORE_PORT=99999:loomrun", "loomrun", store_port_loomrun,
             env={"LOOM_STORE_PORT": "99999"}, mentions=("LOOM_STORE_PORT",)),
        Case("env", "LOOM_STORE_PORT=-1:loomrun", "loomrun", store_port_loomrun,
             env={"LOOM_STORE_PORT": "-1"}, mentions=("LOOM_STORE_PORT",)),
        Case("env", "LOOM_STORE_SECRET-empty:loomrun-nnodes-2", "loomrun",
             ["--nnodes", "2", "--master-port", "29519", "/bin/true"],
             env={"LOOM_STORE_SECRET": ""}, mentions=("LOOM_STORE_SECRET",)),
        Case("env", "LOOM_SHM_SLICE_BYTES=abc:loomrun", "loomrun", store_port_loomrun,
             env={"LOOM_SHM_SLICE_BYTES": "abc"}, mentions=("LOOM_SHM_SLICE_BYTES",)),
        perf_case("LOOM_PERF_COMMAND-odd", ["allreduce"], {}, env={"LOOM_PERF_COMMAND": "\x01;$"},
                  accept=FREE_TEXT, family="env"),
    ]
    return cases


# ---------------------------------------------------------------------------------------------
# Family 7: DeepSpeed configs
# ---------------------------------------------------------------------------------------------

DS_BASE = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}}


def ds(mutate: Callable[[dict], object]) -> str:
    cfg = copy.deepcopy(DS_BASE)
    result = mutate(cfg)
    return result if isinstance(result, str) else json.dumps(cfg if result is None else result)


def zero(key: str, value) -> Callable[[dict], None]:
    return lambda c: c["zero_optimization"].__setitem__(key, value)


def opt(type_: str, **params) -> Callable[[dict], None]:
    return lambda c: c.update({"optimizer": {"type": type_, "params": params}})


DS_CASES: list[tuple[str, Callable[[dict], object], tuple, Optional[Reason]]] = [
    ("not-json", lambda c: "{ nope", ("json",), None),
    ("empty-file", lambda c: "", ("json",), None),
    ("top-level-array", lambda c: "[]", ("object", "top level"), None),
    ("top-level-null", lambda c: "null", ("object", "top level"), None),
    ("trailing-comma", lambda c: '{"zero_optimization": {"stage": 2},}', ("json",), None),
    ("comments", lambda c: '// DeepSpeed\n{"zero_optimization": {"stage": 2}}', ("json",), None),
    ("unknown-key", lambda c: c.update({"zero_optimisation": {}}), ("zero_optimisation",), None),
    ("unknown-nested-key", zero("stgae", 2), ("stgae",), None),
    ("stage-4", zero("stage", 4), ("stage",), None),
    ("stage-negative", zero("stage", -1), ("stage",), None),
    ("stage-string", zero("stage", "3"), ("stage",), None),
    ("stage-float", zero("stage", 2.5), ("stage",), None),
    ("stage-true", zero("stage", True), ("stage",), None),
    ("zero-not-object", lambda c: c.update({"zero_optimization": 2}), ("zero_optimization",),
     None),
    ("micro-batch-zero", lambda c: c.update({"train_micro_batch_size_per_gpu": 0}),
     ("train_micro_batch_size_per_gpu",), None),
    ("micro-batch-huge-float", lambda c: c.update({"train_micro_batch_size_per_gpu": 1e300}),
     ("train_micro_batch_size_per_gpu",), None),
    ("train-batch-mismatch", lambda c: c.update({"train_batch_size": 3}),
     ("train_batch_size",), None),
    ("grad-accum-zero", lambda c: c.update({"gradient_accumulation_steps": 0}),
     ("gradient_accumulation_steps",), None),
    ("clipping-negative", lambda c: c.update({"gradient_clipping": -1}),
     ("gradient_clipping",), None),
    ("clipping-string", lambda c: c.update({"gradient_clipping": "1.0"}),
     ("gradient_clipping",), None),
    ("bf16-and-fp16", lambda c: c.update({"bf16": {"enabled": True}, "fp16": {"enabled": True}}),
     ("bf16", "fp16"), None),
    ("bf16-enabled-string", lambda c: c.update({"bf16": {"enabled": "yes"}}), ("bf16",), None),
    ("fp16-scale-power-65", lambda c: c.update({"fp16": {"enabled": True,
                                                         "initial_scale_power": 65}}),
     ("initial_scale_power",), None),
    ("fp16-window-zero", lambda c: c.update({"fp16": {"enabled": True, "loss_scale_window": 0}}),
     ("loss_scale_window",), None),
    ("fp16-min-scale-negative", lambda c: c.update({"fp16": {"enabled": True,
                                                             "min_loss_scale": -1}}),
     ("min_loss_scale",), None),
    ("offload-param-stage-2", zero("offload_param", {"device": "cpu"}), ("offload_param",), None),
    ("offload-device-gpu", zero("offload_optimizer", {"device": "gpu"}), ("device",), None),
    ("offload-nvme-without-path", zero("offload_optimizer", {"device": "nvme"}),
     ("nvme_path",), None),
    ("offload-nvme-path-number", zero("offload_optimizer", {"device": "nvme", "nvme_path": 5}),
     ("nvme_path",), None),
    ("offload-nvme-path-under-a-file", zero("offload_optimizer", {"device": "nvme",
                                                                  "nvme_path": "blocker/n"}),
     ("nvme", "blocker/n"), None),
    ("param-nvme-paths-differ", lambda c: c["zero_optimization"].update({
        "stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "a"},
        "offload_param": {"device": "nvme", "nvme_path": "b"}}), ("nvme_path",), None),
    ("buffer-count-zero", zero("offload_optimizer", {"device": "cpu", "buffer_count": 0}),
     ("buffer_count",), None),
    ("sub-group-size-zero", zero("sub_group_size", 0), ("sub_group_size",), None),
    ("optimizer-unknown", opt("Lamb", lr=1e-3), ("Lamb",), None),
    ("optimizer-type-missing", lambda c: c.update({"optimizer": {"params": {}}}),
     ("optimizer.type",), None),
    ("optimizer-adam-l2", opt("Adam", adam_w_mode=False), ("adam_w_mode",), None),
    ("optimizer-amsgrad", opt("AdamW", amsgrad=True), ("amsgrad",), None),
    ("optimizer-sgd-with-betas", opt("SGD", betas=[0.9, 0.99]), ("betas",), None),
    ("optimizer-adamw-with-momentum", opt("AdamW", momentum=0.9), ("momentum",), None),
    ("lr-negative", opt("AdamW", lr=-1), ("lr",), None),
    ("lr-string", opt("AdamW", lr="0.001"), ("lr",), None),
    ("betas-one-value", opt("AdamW", betas=[0.9]), ("betas",), None),
    ("betas-above-one", opt("AdamW", betas=[2.0, 3.0]), ("betas", "beta1", "beta"), None),
    ("betas-negative", opt("AdamW", betas=[-0.5, 0.999]), ("betas", "beta1", "beta"), None),
    ("eps-zero", opt("AdamW", eps=0), ("eps",), None),
    ("eps-1e400", lambda c: '{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": '
                            '"AdamW", "params": {"eps": 1e400}}}', ("eps", "json"), None),
    ("momentum-negative", opt("SGD", momentum=-0.9), ("momentum",), None),
    ("all-auto", lambda c: {"train_micro_batch_size_per_gpu": "auto",
                            "zero_optimization": {"stage": "auto"}, "gradient_clipping": "auto"},
     (), DS_AUTO),
]


def deepspeed_family() -> list[Case]:
    cases = []
    base = {"--batch": None}
    for name, mutate, mentions, accept in DS_CASES:
        setup = chain(write("ds.json", ds(mutate)), write("blocker", "x"))
        cases.append(gpt("deepspeed", name, base, extra=["--deepspeed-config", "ds.json"],
                         setup=setup, mentions=mentions + ("ds.json",), accept=accept))
    cases += [
        gpt("deepspeed", "with-strategy", {**base, "--strategy": "ddp"},
            extra=["--deepspeed-config", "ds.json"], setup=write("ds.json", ds(lambda c: None)),
            mentions=("--strategy",)),
        gpt("deepspeed", "batch-flag-disagrees", {"--batch": "4"},
            extra=["--deepspeed-config", "ds.json"], setup=write("ds.json", ds(lambda c: None)),
            mentions=("--batch",)),
        gpt("deepspeed", "missing-file", base, extra=["--deepspeed-config", "none.json"],
            mentions=("none.json",)),
        gpt("deepspeed", "directory", base, extra=["--deepspeed-config", "adir"],
            setup=mkdir("adir"), mentions=("adir",)),
        gpt("deepspeed", "binary-garbage", base, extra=["--deepspeed-config", "ds.json"],
            setup=write("ds.json", garbage(512)), mentions=("ds.json",)),
        gpt("deepspeed", "control:stage-2", base, extra=["--deepspeed-config", "ds.json"],
            setup=write("ds.json", ds(lambda c: None)), control=True),
        # a static loss scale so large that every step's gradients overflow: every step is
        # skipped, nothing is trained, and the run must say so with a failure, not exit 0
        gpt("deepspeed", "fp16-static-scale-skips-every-step",
            {**base, "--steps": "30", "--lr": "1e6", "--precision": "16-mixed"},
            extra=["--deepspeed-config", "ds.json"],
            setup=write("ds.json", json.dumps({"train_micro_batch_size_per_gpu": 2,
                                               "fp16": {"enabled": True, "loss_scale": 1e300}})),
            setup_note="ds.json: fp16 with a static loss_scale of 1e300",
            mentions=("skipped",), ci=True),
    ]
    return cases


# ---------------------------------------------------------------------------------------------
# Family 8: loom-trace
# ---------------------------------------------------------------------------------------------

def flight_entry(**over) -> dict:
    entry = {"group": "default.attempt0", "group_rank": 0, "group_size": 2, "seq": 1,
             "op": "allreduce", "bytes": 16, "dtype": "f32", "peer": -1, "state": "completed",
             "queued_us": 0, "started_us": 1, "completed_us": 2, "error": ""}
    entry.update(over)
    return entry


def dumps(rank0: object, rank1: object = None) -> Setup:
    def text(obj):
        return obj if isinstance(obj, str) else json.dumps(obj)
    one = {"rank": 1, "entries": [flight_entry(group_rank=1)]} if rank1 is None else rank1
    return chain(write("dumps/flight.rank-0.json", text(rank0)),
                 write("dumps/flight.rank-1.json", text(one)))


def trace_family() -> list[Case]:
    good = {"rank": 0, "entries": [flight_entry()]}
    rows = [  # (name, setup, mentions, accept)
        ("missing-dir", None, ("dumps",), None),
        ("empty-dir", mkdir("dumps"), ("flight.rank",), None),
        ("dir-is-a-file", write("dumps", "x"), ("dumps",), None),
        ("not-json", dumps("{ nope"), ("flight.rank-0.json",), None),
        ("empty-file", dumps(""), ("flight.rank-0.json",), None),
        ("array", dumps("[]"), ("flight.rank-0.json",), None),
        ("rank-missing", dumps({"entries": []}), ("flight.rank-0.json", "rank"), None),
        ("rank-string", dumps({"rank": "0", "entries": []}), ("flight.rank-0.json", "rank"), None),
        ("entries-missing", dumps({"rank": 0}), ("flight.rank-0.json", "entries"), None),
        ("entries-not-list", dumps({"rank": 0, "entries": 5}), ("flight.rank-0.json", "entries"),
         None),
        ("entry-op-number", dumps({"rank": 0, "entries": [flight_entry(op=5)]}),
         ("flight.rank-0.json", "op"), None),
        ("entry-seq-negative", dumps({"rank": 0, "entries": [flight_entry(seq=-1)]}),
         ("flight.rank-0.json", "seq"), None),
        ("entry-bytes-string", dumps({"rank": 0, "entries": [flight_entry(bytes="16")]}),
         ("flight.rank-0.json", "bytes"), None),
        ("entry-missing-group", dumps({"rank": 0, "entries": [
            {k: v for k, v in flight_entry().items() if k != "group"}]}),
         ("flight.rank-0.json", "group"), None),
        ("entry-missing-peer", dumps({"rank": 0, "entries": [
            {k: v for k, v in flight_entry().items() if k != "peer"}]}),
         ("flight.rank-0.json", "peer"), None),
        ("two-files-same-rank", dumps(good, {"rank": 0, "entries": [flight_entry()]}),
         ("rank 0", "twice", "flight.rank-1.json"), None),
        ("rank-negative", dumps({"rank": -3, "entries": [flight_entry()]}),
         ("rank", "-3"), None),
        ("seq-range-huge", dumps({"rank": 0, "entries": [flight_entry(seq=0),
                                                         flight_entry(seq=2 ** 64 - 1)]}),
         (), TRACE_GAP),
        ("group-size-zero", dumps({"rank": 0, "entries": [flight_entry(group_size=0)]}),
         ("group_size",), None),
        ("control:agreeing-ranks", dumps(good), (), "control"),
    ]
    cases = []
    for name, setup, mentions, accept in rows:
        control = accept == "control"
        cases.append(Case("trace", name, "loom-trace", ["analyze", "dumps"], setup=setup,
                          mentions=mentions, control=control,
                          accept=None if control else accept, ok_codes=(0, 1)))
    cases.append(Case("trace", "no-subcommand", "loom-trace", ["dumps"], mentions=("analyze",),
                      ok_codes=(0, 1)))
    cases.append(Case("trace", "dump-is-a-fifo", "loom-trace", ["analyze", "dumps"],
                      setup=chain(dumps({"rank": 0, "entries": [flight_entry()]}),
                                  remove("dumps/flight.rank-1.json"),
                                  make_fifo("dumps/flight.rank-1.json")),
                      setup_note="dumps/flight.rank-1.json: a FIFO nobody writes to",
                      mentions=("flight.rank-1.json",), expect=within(5.0),
                      expect_note="refused within 5 s, not blocked opening it", ok_codes=(0, 1),
                      timeout=10.0, ci=True))
    return cases


# ---------------------------------------------------------------------------------------------
# Running one case
# ---------------------------------------------------------------------------------------------

def clean_env() -> dict[str, str]:
    """Nothing from the caller's launcher or Loom settings: only what a shell needs."""
    keep = ("PATH", "HOME", "TMPDIR", "LD_LIBRARY_PATH")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env["LANG"] = "C.UTF-8"
    return env


def shm_names() -> set[str]:
    try:
        return {n for n in os.listdir("/dev/shm") if n.lower().startswith(("loom", "sem.loom"))}
    except OSError:
        return set()


def session_processes(sid: int) -> list[tuple[int, str]]:
    """(pid, command name) of the live processes of session `sid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.find("(") + 1:stat.rfind(")")]
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":  # fields[3]: session id
            found.append((int(entry), name))
    return found


def sweep_session(sid: int, grace: float = 3.0) -> list[str]:
    """Waits up to `grace` seconds for the case's session to empty (a rank may still be on
    its way out), then kills what is left; returns 'pid name' of each process it killed."""
    deadline = time.monotonic() + grace
    left = session_processes(sid)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = session_processes(sid)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return [f"{pid} {name}" for pid, name in left]


def substitute(text: str, tools: dict[str, Path]) -> str:
    for key, path in tools.items():
        text = text.replace(f"@{key}@", str(path))
    return text


# Trailing lines that carry no diagnosis of their own: a usage hint, and a launcher's epilogue
# saying that a rank failed (the rank's own message, relayed, comes just before it) or which
# shared-memory segments the failed ranks left (removed when the group is gone, so the line
# follows the rank's message whenever the rank took long enough to create one).
EPILOGUE = re.compile(r"--help|^loomrun: rank \d+ \(pid \d+\) (exited|was killed)|"
                      r"^loomrun: removed \d+ shared-memory segment|"
                      r"^loom-perf --np: removed \d+ shared-memory segment|"
                      r"^loom-perf --np: rank \d+ exited|^\[launch\] rank \d+ (exited|was killed)")


def error_line(stderr: str, stdout: str) -> str:
    """The last non-empty line of stderr (of stdout when stderr is empty, as loom-ckpt diff
    reports there), skipping trailing EPILOGUE lines."""
    lines = [l.strip() for l in (stderr or stdout).splitlines() if l.strip()]
    while len(lines) > 1 and EPILOGUE.search(lines[-1]):
        lines.pop()
    return lines[-1] if lines else ""


def classify(case: Case, rc: Optional[int], stderr: str, line: str) -> str:
    """The class before evidence: refused, accepted-ok and ok may still be turned into
    refused-otherwise, accepted-otherwise or wrongly-refused by the case's check."""
    if rc is None:
        return "hang"
    if rc < 0 or rc >= 128 or any(marker in stderr for marker in CRASH_MARKERS):
        return "crash"
    if rc in case.ok_codes:
        if case.control:
            return "ok"
        return "accepted-ok" if case.accept else "silent"
    if case.control:
        return "wrongly-refused"
    if case.accept:
        return "refused-instead"
    if not line:
        return "unclear"
    if case.mentions and not any(m.lower() in line.lower() for m in case.mentions):
        return "unclear"
    return "refused"


def run_command(argv: list[str], cwd: Path, env: dict[str, str], timeout: float,
                logs: Path) -> tuple[Optional[int], str, str, float, list[str]]:
    """Runs argv in its own session; returns (exit status or None at the timeout, stdout,
    stderr, seconds, 'pid name' of each process of the session left behind, then killed)."""
    start = time.monotonic()
    with open(logs / "out", "wb") as out, open(logs / "err", "wb") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc: Optional[int] = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    seconds = time.monotonic() - start
    procs_left = sweep_session(proc.pid)
    stdout = (logs / "out").read_bytes().decode(errors="replace")
    stderr = (logs / "err").read_bytes().decode(errors="replace")
    return rc, stdout, stderr, seconds, procs_left


def run_case(case: Case, tools: dict[str, Path], root: Path, timeout: float) -> Outcome:
    workdir = Path(tempfile.mkdtemp(prefix="case-", dir=root))
    logs = Path(tempfile.mkdtemp(prefix="logs-", dir=root))
    timeout = min(timeout, case.timeout or timeout)
    try:
        try:
            if case.setup:
                case.setup(workdir)
        except Skip as e:
            return Outcome(case, "skipped", None, 0.0, str(e), "", "", [], [])
        except Exception as e:  # a broken setup is the campaign's bug: report it, go on
            return Outcome(case, "setup-error", None, 0.0, f"{type(e).__name__}: {e}", "", "",
                           [], [])
        env = {**clean_env(), **case.env}
        shm_before = shm_names()
        rc, stdout, stderr, seconds, procs_left = run_command(
            [str(tools[case.tool])] + [substitute(a, tools) for a in case.args], workdir, env,
            timeout, logs)
        refused = rc is not None and rc not in case.ok_codes
        line = error_line(stderr, stdout) if refused else error_line(stderr, "")
        cls = classify(case, rc, stderr, line)
        evidence = ""
        check = case.accept.check if case.accept else case.expect
        if check and cls in ("accepted-ok", "refused", "hang", "unclear", "silent"):
            def rerun(args: list[str], env_changes: dict) -> tuple[Optional[int], str, str]:
                changed = {**env, **env_changes}
                changed = {k: v for k, v in changed.items() if v is not None}
                rc2, out2, err2, _, left = run_command(
                    [str(tools[case.tool])] + [substitute(a, tools) for a in args], workdir,
                    changed, timeout, logs)
                procs_left.extend(left)
                return rc2, out2, err2
            seen = Seen(case, workdir, rc, stdout, stderr, line, seconds, rerun)
            try:
                evidence = check(seen) or ""
            except Exception as e:
                evidence = f"the check failed: {type(e).__name__}: {e}"
            if evidence and cls == "accepted-ok":
                cls = "accepted-otherwise"
            elif evidence and cls == "refused":
                cls = "refused-otherwise"
        shm_left = leftover_shm(shm_before)
        return Outcome(case, cls, rc, seconds, line, stdout, stderr, shm_left, procs_left,
                       evidence)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)


def leftover_shm(before: set[str]) -> list[str]:
    """New loom* entries of /dev/shm that are still there a moment later (a segment of a job
    running beside the campaign is unlinked within milliseconds); they are then removed."""
    new = shm_names() - before
    if not new:
        return []
    time.sleep(0.5)
    left = sorted(n for n in new if os.path.exists(f"/dev/shm/{n}"))
    for name in left:
        try:
            os.unlink(f"/dev/shm/{name}")
        except OSError:
            pass
    return left


# ---------------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------------

COLUMNS = ("cases", "refused", "accepted-ok", "ok", "skipped", "unclear", "refused-otherwise",
           "crash", "hang", "silent", "accepted-otherwise", "refused-instead", "wrongly-refused",
           "setup-error", "shm-left", "procs-left", "findings")
HEADERS = {"accepted-ok": "acc-ok", "refused-otherwise": "ref-oth",
           "accepted-otherwise": "acc-oth", "refused-instead": "ref-inst",
           "wrongly-refused": "wrong-ref", "setup-error": "setup-err"}


def summarize(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for o in outcomes:
        for family in (o.case.family, "TOTAL"):
            row = table.setdefault(family, dict.fromkeys(COLUMNS, 0))
            row["cases"] += 1
            row[o.cls] += 1
            row["shm-left"] += len(o.shm_left)
            row["procs-left"] += len(o.procs_left)
            row["findings"] += o.finding
    total = table.pop("TOTAL", dict.fromkeys(COLUMNS, 0))
    return {**table, "TOTAL": total}


def print_table(table: dict[str, dict[str, int]]) -> None:
    heads = [HEADERS.get(c, c) for c in COLUMNS]
    widths = [max(5, len(h) + 1) for h in heads]
    print(f"{'family':<12}" + "".join(f"{h:>{w}}" for h, w in zip(heads, widths)))
    for family, row in table.items():
        print(f"{family:<12}" + "".join(f"{row[c]:>{w}}" for c, w in zip(COLUMNS, widths)))


def shown_command(case: Case) -> str:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in case.env.items())
    args = " ".join(shlex.quote(a.replace("@train_gpt@", "train_gpt")) for a in case.args)
    return f"{env + ' ' if env else ''}{case.tool} {args}"


def tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def print_finding(o: Outcome) -> None:
    what = [o.cls] if o.cls in FINDING_CLASSES else []
    what += [f"/dev/shm left: {', '.join(o.shm_left)}"] if o.shm_left else []
    what += [f"processes left: {', '.join(o.procs_left)}"] if o.procs_left else []
    print(f"\n--- {o.case.id}: {'; '.join(what)}"
          f"{' (' + o.case.note + ')' if o.case.note else ''}")
    if o.case.setup_note:
        print(f"    setup: {o.case.setup_note}")
    print(f"    $ {shown_command(o.case)}")
    print(f"    exit: {'timeout' if o.rc is None else o.rc} after {o.seconds:.1f} s")
    if o.case.accept:
        print(f"    accepted because: {o.case.accept.text}")
        print(f"    evidence: {o.case.accept.shows}")
    elif o.case.expect_note:
        print(f"    expected: {o.case.expect_note}")
    if o.evidence:
        print(f"    seen instead: {o.evidence}")
    if o.cls == "unclear":
        print(f"    error line: {o.error_line!r} (expected it to name one of "
              f"{', '.join(repr(m) for m in o.case.mentions)})")
    elif o.cls in ("setup-error", "refused-instead"):
        print(f"    {'error line' if o.cls == 'refused-instead' else 'setup'}: {o.error_line}")
    for label, text in (("stdout", o.stdout), ("stderr", o.stderr)):
        if text.strip():
            print(f"    {label} tail:")
            print("      " + tail(text).replace("\n", "\n      "))


def write_json(path: Path, outcomes: list[Outcome], table: dict, seconds: float,
               mode: str) -> None:
    rows = [{"id": o.case.id, "family": o.case.family, "class": o.cls, "finding": o.finding,
             "command": shown_command(o.case), "setup": o.case.setup_note, "exit": o.rc,
             "seconds": round(o.seconds, 3), "error_line": o.error_line,
             "accept_reason": o.case.accept.text if o.case.accept else None,
             "evidence": o.case.accept.shows if o.case.accept else o.case.expect_note,
             "evidence_seen": o.evidence, "note": o.case.note, "shm_left": o.shm_left,
             "procs_left": o.procs_left, "stdout_tail": tail(o.stdout),
             "stderr_tail": tail(o.stderr)} for o in outcomes]
    path.write_text(json.dumps({"mode": mode, "seconds": round(seconds, 1), "summary": table,
                                "cases": rows}, indent=1))


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------

def all_cases(fx: Fixtures, tools: dict[str, Path]) -> list[Case]:
    return (flag_family(fx) + loomrun_family(tools) + perf_family() + ckpt_family(fx)
            + safetensors_family(fx) + env_family(tools) + deepspeed_family() + trace_family())


def quick_subset(cases: list[Case], target: int = 60) -> list[Case]:
    """Every control case, then bad inputs spread evenly over each family (at least 3 per
    family), about `target` cases in all."""
    controls = [c for c in cases if c.control]
    rest = [c for c in cases if not c.control]
    budget = target - len(controls)
    chosen = []
    for family in dict.fromkeys(c.family for c in rest):
        members = [c for c in rest if c.family == family]
        want = min(len(members), max(3, round(budget * len(members) / len(rest))))
        step = len(members) / want
        chosen += [members[int(i * step)] for i in range(want)]
    keep = {id(c) for c in controls + chosen}
    return [c for c in cases if id(c) in keep]


CI_SPREAD = 9  # --ci: one case in CI_SPREAD of each category, at least its first


def ci_subset(cases: list[Case]) -> list[Case]:
    """The fixed CI selection (no randomness; the same list on every run of one tree): every
    control, every case marked ci (the newest checks), the first case of every accepted
    Reason (each reason's evidence runs once), and in every category (family and the name's
    first part, or the case's own category: a flag, a file, a corruption x reader) its
    first case and every CI_SPREAD-th after it."""
    keep: set[int] = set()
    reasons: set[int] = set()
    by_group: dict[str, list[Case]] = {}
    for c in cases:
        by_group.setdefault(c.group, []).append(c)
        if c.control or c.ci:
            keep.add(id(c))
        if c.accept and id(c.accept) not in reasons:
            reasons.add(id(c.accept))
            keep.add(id(c))
    for members in by_group.values():
        keep.update(id(c) for c in members[::CI_SPREAD])
    return [c for c in cases if id(c) in keep]


def snapshot_tools(build: Path, root: Path, wait_s: float = 300.0) -> dict[str, Path]:
    """Copies the binaries, so that a rebuild of `build` during the campaign changes nothing.
    A binary that is missing or still being linked (modified in the last 5 s) is waited for,
    up to `wait_s` seconds."""
    (root / "bin").mkdir()
    tools = {}
    deadline = time.monotonic() + wait_s
    for name, relative in TOOLS.items():
        source = build / relative
        tools[name] = root / "bin" / source.name
        copy_settled(source, tools[name], deadline, "bad_inputs")
    return tools


def check_unique(cases: list[Case]) -> None:
    seen = set()
    for c in cases:
        if c.id in seen:
            sys.exit(f"bad_inputs: two cases are named {c.id}")
        seen.add(c.id)


def parse_args() -> argparse.Namespace:
    repo = Path(__file__).resolve().parents[2]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", type=Path, default=repo / "build" / "release",
                   help="build directory holding tools/ (default: build/release)")
    p.add_argument("--json", type=Path, help="also write every outcome here")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--ci", action="store_true",
                      help="the fixed CI subset: every category and accepted reason (< 3 min)")
    mode.add_argument("--quick", action="store_true", help="about 60 cases (under 2 minutes)")
    p.add_argument("--only", help="run the cases whose id matches this regular expression")
    p.add_argument("--timeout", type=float,
                   help="seconds per case (default 20; 10 with --ci or --quick)")
    p.add_argument("--list", action="store_true", help="list the case ids and exit")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    started = time.monotonic()
    mode = "ci" if args.ci else "quick" if args.quick else "full"
    timeout = args.timeout or (10.0 if mode != "full" else 20.0)
    with tempfile.TemporaryDirectory(prefix="loom-bad-inputs-") as tmp:
        root = Path(tmp)
        tools = snapshot_tools(args.build.resolve(), root)
        fx = Fixtures(root, tools)
        cases = all_cases(fx, tools)
        check_unique(cases)
        if args.only:
            cases = [c for c in cases if re.search(args.only, c.id)]
        if args.ci:
            cases = ci_subset(cases)
        elif args.quick:
            cases = quick_subset(cases)
        if args.list:
            print("\n".join(c.id for c in cases))
            return 0
        print(f"bad_inputs ({mode}): {len(cases)} cases, {timeout:g} s timeout each, binaries "
              f"from {args.build}", flush=True)
        outcomes = []
        for i, case in enumerate(cases, 1):
            outcome = run_case(case, tools, root, timeout)
            outcomes.append(outcome)
            if outcome.finding:
                print(f"  [{i}/{len(cases)}] {case.id}: {outcome.cls}"
                      f"{' +shm' if outcome.shm_left else ''}"
                      f"{' +procs' if outcome.procs_left else ''}", flush=True)
    elapsed = time.monotonic() - started
    table = summarize(outcomes)
    findings = [o for o in outcomes if o.finding]
    print(f"\nFindings ({len(findings)}):")
    for o in findings:
        print_finding(o)
    print(f"\nSummary ({len(outcomes)} cases in {elapsed:.0f} s, fixtures included):")
    print_table(table)
    if args.json:
        write_json(args.json, outcomes, table, elapsed, mode)
        print(f"\nwrote {args.json}")
    total = table["TOTAL"]
    print(f"\nbad_inputs {mode}: {len(outcomes)} cases, {total['refused']} refused, "
          f"{total['accepted-ok']} accepted with evidence, {total['ok']} controls ok, "
          f"{len(findings)} findings, {elapsed:.0f} s")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
