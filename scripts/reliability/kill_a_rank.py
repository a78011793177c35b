#!/usr/bin/env python3
"""Kill (or stop) one rank of a small Loom job and check what the survivors and the launcher do.

Trial after trial this script starts a multi-process Loom job, SIGKILLs exactly one rank at
a random moment (during setup, mid-run or near the end) and records, for every surviving
rank and for the launcher: the exit status, the time from the kill to its exit, and whether
its stderr names the dead rank. After each trial it checks that nothing of the job is left:
no process (every process of a job carries a unique environment tag) and no new /dev/shm
entry that no live process maps. Whatever happens, the job's processes are killed
(killpg) at the end of the trial.

Workloads of the kill trials, chosen round-robin:
  * loom-perf COLLECTIVE (allreduce, broadcast, reduce, all_gather, reduce_scatter,
    all_to_all, sendrecv, barrier) on 2 and 3 ranks, shm backend, 8 B to 2 MiB,
    `--timeout 10`, started by loomrun (or by `loom-perf --np`, see --launcher);
  * train_gpt --strategy ddp on 2 ranks under loomrun with a 1-layer, 32-wide model.
Before its first trial each workload runs once without a kill; its iteration (step) count
is scaled so that a run lasts about --target-s seconds, and that run must succeed.

A kill trial fails when: the launcher exits 0; the launcher's own messages do not name the
killed rank; a survivor or the launcher is still running TIMEOUT_S + 1 s after the kill; a
survivor exits with an error code of its own without naming the dead rank (naming a peer
that "gave up on the group" counts when that peer's own error names the dead rank); or a
process or a /dev/shm segment of the job is left over. A survivor stopped by the
launcher's SIGTERM before it noticed is not expected to name anything. A trial whose chosen
rank ended on its own before the kill landed is skipped and run again (at most twice more,
planned with the shorter run time it showed).

Stop trials (--stops, "stop" in the report) SIGSTOP one rank mid-run instead: it stays alive
(its pid is there, it holds its segments) but never answers, which only a deadline catches.
Workloads: train_gpt --timeout 3 (the collective timeout) on 2 ranks, self-spawned under
ddp_spawn and under deepspeed_stage_3 (the stopped rank is the spawned one: stopping the
job's own first process stops the job itself, which nothing inside it can undo), and
under loomrun with --strategy ddp (any rank). The whole job must exit non-zero within the
3 s timeout plus STOP_GRACE_S (15 s: the survivors' own exit, a launcher's SIGTERM-to-SIGKILL
grace of 5 s, a spawner's kill of the stopped rank), and then nothing of the job may be left:
no process (the stopped rank included: its launcher or spawner must kill it) and no new
/dev/shm entry. The stopped rank is sent SIGCONT and SIGKILL in the clean-up.

The programs are copied from --build first (and waited for while being relinked), so that
a concurrent rebuild cannot change them mid-run; the build time of the copies is printed.

The kill trials' train_gpt runs without --timeout (the default 300 s): its survivors are
bounded by loomrun, which stops the other ranks (SIGTERM, then SIGKILL after its 5 s grace
period) as soon as one fails.

Exit statuses of survivors (grandchildren of this script) are read with the pidfd
PIDFD_GET_INFO ioctl (PIDFD_INFO_EXIT, Linux 6.15+); on older kernels they read "unknown".

Usage (from the repository root; Python 3 standard library only, Linux, run as the same
user as the job):
  python3 scripts/reliability/kill_a_rank.py [--build build/release] [--trials 60]
      [--stops 6] [--seed S] [--json OUT.json] [--launcher loomrun|np] [--target-s 2.0]
  python3 scripts/reliability/kill_a_rank.py --ci      # CI: seed 20261202, 22 kills on 7
                                                       # workloads and 3 stops (< 2 min)
Exit status: 0 when every trial passed, 1 otherwise. The last line is one summary line
(trials, kills, stops, failures, seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import random
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from snapshot import copy_settled  # noqa: E402

COLLECTIVES = ["allreduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
               "all_to_all", "sendrecv", "barrier"]
PERF_WORLD_SIZES = [2, 3]
TIMEOUT_S = 10.0           # loom-perf --timeout: the bound on any one collective
BOUND_S = TIMEOUT_S + 1.0  # everything must have exited this long after the kill
OBSERVE_EXTRA_S = 4.0      # keep watching past the bound, to see how late a straggler is
DISCOVERY_TIMEOUT_S = 10.0
MOMENTS = ["setup", "mid", "end"]
STOP_TIMEOUT_S = 3.0       # train_gpt --timeout of the stop trials
STOP_GRACE_S = 15.0        # ... plus this: the whole job must be gone
STOP_BOUND_S = STOP_TIMEOUT_S + STOP_GRACE_S
STOP_SCALE = 3             # a stop workload runs this many times its calibrated steps
CI_SEED = 20261202
CI_KILLS = 22              # --ci: at least 20 kills even if two trials end up skipped
CI_STOPS = 3
SKIP_RETRIES = 2           # a trial whose rank ended before the kill is run again
TAG_VAR = "LOOM_KILL_A_RANK_TAG"
# Variables a launcher sets for its ranks: never inherited from our environment, so that a
# child that has not yet exec'ed its rank program has no RANK.
LAUNCHER_VARS = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "LOOM_STORE_SECRET", "LOOM_STORE_PORT",
                 "LOOM_STORE_SERVED_BY_LAUNCHER", "LOOM_CLUSTER_ENV", "LOOM_PERF_COMMAND"]

# ioctl(pidfd, PIDFD_GET_INFO, struct pidfd_info) with PIDFD_INFO_EXIT (linux/pidfd.h).
PIDFD_INFO_SIZE = 64
PIDFD_GET_INFO = (3 << 30) | (PIDFD_INFO_SIZE << 16) | (0xFF << 8) | 11
PIDFD_INFO_EXIT = 1 << 3
PIDFD_INFO_EXIT_CODE_OFFSET = 60


# ----------------------------------------------------------------------------- workloads

@dataclasses.dataclass
class Workload:
    """One job shape: which program, how many ranks, and how long it runs."""
    name: str
    program: str          # "loom-perf" or "train_gpt"
    world: int
    launcher: str         # "loomrun", "np" (loom-perf --np) or "self" (train_gpt spawns)
    collective: str = ""
    scale: int = 100      # loom-perf -n, or train_gpt --steps
    duration_s: float = 0.0  # of an unkilled run, once calibrated
    setup_s: float = 0.2     # until every rank attached the shm segment (unkilled run)
    strategy: str = "ddp"    # train_gpt's
    action: str = "kill"     # what its trials do to a rank: "kill" or "stop"

    def command(self, build: Path) -> list[str]:
        tools = build / "tools"
        if self.program == "train_gpt":
            program = [str(tools / "train_gpt" / "train_gpt"), "--strategy", self.strategy,
                       "--layers", "1", "--heads", "1", "--embd", "32", "--ctx", "32",
                       "--batch", "4", "--steps", str(self.scale),
                       "--process-group-backend", "shm"]
            if self.action == "stop":
                program += ["--timeout", f"{STOP_TIMEOUT_S:g}"]
            if self.launcher == "self":
                return program + ["--devices", str(self.world)]
        else:
            program = [str(tools / "loom_perf" / "loom-perf"), self.collective,
                       "--backend", "shm", "-b", "8", "-e", "2M", "-f", "8",
                       "-n", str(self.scale), "-w", "5", "--timeout", f"{TIMEOUT_S:g}"]
        if self.launcher == "np":
            return program + ["--np", str(self.world)]
        return [str(tools / "loomrun" / "loomrun"), "--nproc-per-node", str(self.world),
                "--master-port", "0"] + program


PROGRAMS = ["tools/loomrun/loomrun", "tools/loom_perf/loom-perf", "tools/train_gpt/train_gpt"]


def snapshot_programs(build: Path, dest: Path, wait_s: float = 300.0) -> Path:
    """Copies the three programs (Loom's own libraries are linked in statically) under
    `dest`, same layout, so that a rebuild in `build` cannot swap or truncate them
    mid-run. A program still being linked (empty, or modified in the last 5 s) is waited
    for. Returns `dest`."""
    deadline = time.monotonic() + wait_s
    for relative in PROGRAMS:
        copy_settled(build / relative, dest / relative, deadline, "kill_a_rank")
    return dest


def make_workloads(launcher: str) -> list[Workload]:
    workloads = [Workload(name=f"loom-perf {c} x{n}", program="loom-perf", world=n,
                          launcher=launcher, collective=c, scale=100)
                 for n in PERF_WORLD_SIZES for c in COLLECTIVES]
    workloads.append(Workload(name="train_gpt ddp x2", program="train_gpt", world=2,
                              launcher="loomrun", scale=300))
    return workloads


def make_stop_workloads() -> list[Workload]:
    return [Workload(name="stop: train_gpt ddp_spawn x2", program="train_gpt", world=2,
                     launcher="self", strategy="ddp_spawn", scale=300, action="stop"),
            Workload(name="stop: train_gpt zero3 x2", program="train_gpt", world=2,
                     launcher="self", strategy="deepspeed_stage_3", scale=300, action="stop"),
            Workload(name="stop: train_gpt ddp x2 loomrun", program="train_gpt", world=2,
                     launcher="loomrun", strategy="ddp", scale=300, action="stop")]


# --ci's kill workloads: 2 and 3 ranks, the ring, the one-to-all, the pairwise and the
# barrier paths, and train_gpt (about a third of the full set's calibration time).
CI_KILL_WORKLOADS = ["loom-perf allreduce x2", "loom-perf broadcast x3",
                     "loom-perf reduce_scatter x3", "loom-perf all_to_all x2",
                     "loom-perf sendrecv x2", "loom-perf barrier x3", "train_gpt ddp x2"]


# ----------------------------------------------------------------------------- /proc

def child_pids(pid: int) -> list[int]:
    """Direct children of `pid`, from every one of its threads."""
    pids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return pids


def environ_of(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return {}
    env = {}
    for entry in entries:
        key, sep, value = entry.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def process_state(pid: int) -> str | None:
    """The one-letter state of `pid` (R, S, Z, ...), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2]


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def tagged_processes(tag: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries this trial's tag."""
    return [pid for pid in all_pids()
            if pid != os.getpid() and environ_of(pid).get(TAG_VAR) == tag
            and process_state(pid) not in (None, "Z")]


def describe_process(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"pid {pid} ({process_state(pid)}): {cmd[:160]}"


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm"))


def mapped_shm_names() -> set[str]:
    """Names under /dev/shm that some live process has mapped."""
    names = set()
    for pid in all_pids():
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    at = line.find("/dev/shm/")
                    if at >= 0:
                        names.add(line[at + 9:].split()[0])
        except OSError:
            continue
    return names


# ----------------------------------------------------------------------------- pidfds

def exit_status(pidfd: int) -> int | None:
    """The wait status of the process behind `pidfd` once it has been reaped, else None."""
    buf = bytearray(struct.pack("=Q", PIDFD_INFO_EXIT) + bytes(PIDFD_INFO_SIZE - 8))
    try:
        fcntl.ioctl(pidfd, PIDFD_GET_INFO, buf)
    except OSError:
        return None
    (mask,) = struct.unpack_from("=Q", buf, 0)
    if not mask & PIDFD_INFO_EXIT:
        return None
    return struct.unpack_from("=i", buf, PIDFD_INFO_EXIT_CODE_OFFSET)[0]


def describe_status(status: int | None) -> str:
    if status is None:
        return "unknown"
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit {os.WEXITSTATUS(status)}"


def watch_exits(pidfds: dict[str, int], until: float) -> dict[str, float]:
    """Waits until every process exits or `until` (monotonic); returns label -> exit time."""
    poller = select.poll()
    label_of = {}
    for label, fd in pidfds.items():
        poller.register(fd, select.POLLIN)
        label_of[fd] = label
    exited: dict[str, float] = {}
    while len(exited) < len(pidfds):
        left_ms = (until - time.monotonic()) * 1000
        if left_ms <= 0:
            break
        for fd, _ in poller.poll(left_ms):
            exited[label_of[fd]] = time.monotonic()
            poller.unregister(fd)
    return exited


# ----------------------------------------------------------------------------- jobs

def job_environment(tag: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env[TAG_VAR] = tag
    return env


def start_job(command: list[str], tag: str, out_dir: Path) -> tuple[subprocess.Popen, float]:
    """Starts the launcher in a new session; its output goes to files in `out_dir`."""
    stdout = open(out_dir / "stdout.txt", "wb")
    stderr = open(out_dir / "stderr.txt", "wb")
    start = time.monotonic()
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                            env=job_environment(tag), start_new_session=True)
    stdout.close()
    stderr.close()
    return proc, start


def discover_ranks(launcher: subprocess.Popen, world: int,
                   self_spawned: bool = False) -> dict[int, int]:
    """rank -> pid of the launcher's children once each has exec'ed (has RANK set); of a
    self-spawned job (train_gpt --strategy ddp_spawn ...) the launcher itself is rank 0."""
    deadline = time.monotonic() + DISCOVERY_TIMEOUT_S
    ranks: dict[int, int] = {0: launcher.pid} if self_spawned else {}
    while time.monotonic() < deadline and launcher.poll() is None:
        for pid in child_pids(launcher.pid):
            rank = environ_of(pid).get("RANK")
            if rank is not None and rank.isdigit():
                ranks[int(rank)] = pid
        if len(ranks) == world:
            break
        time.sleep(0.0005)
    return ranks


def clean_up(launcher: subprocess.Popen, rank_fds: dict[int, int], tag: str) -> None:
    """Kills whatever is left of the job: the ranks, the launcher's process group, then the
    process group of every process still carrying the job's tag."""
    for fd in rank_fds.values():
        try:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass  # gone already
    if launcher.poll() is None:  # not reaped: its pid, hence its group id, is still ours
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
    for _ in range(100):
        pids = tagged_processes(tag)
        if not pids:
            return
        for pid in pids:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)


def leaked_shm(before: set[str]) -> list[str]:
    """New /dev/shm entries that no live process maps; Loom's are removed."""
    new = shm_entries() - before
    if not new:
        return []
    leaked = sorted(new - mapped_shm_names())
    for name in leaked:
        if name.startswith("loom-"):
            try:
                os.unlink(f"/dev/shm/{name}")
            except OSError:
                pass
    return leaked


# ----------------------------------------------------------------------------- messages

PEER_RE = re.compile(r"\bpeer (\d+)\b")
PID_RE = re.compile(r"\(pid (\d+)\)")
RANK_RE = re.compile(r"\brank (\d+)\b")
GAVE_UP_RE = re.compile(r"\bpeer (\d+) gave up on the group")  # comm/shm/peer_wait.cpp


def split_output(text: str, launcher: str) -> tuple[dict[int, list[str]], list[str]]:
    """Splits the launcher's stderr into rank -> lines and the launcher's own lines."""
    by_rank: dict[int, list[str]] = {}
    own: list[str] = []
    for line in text.splitlines():
        if launcher == "loomrun":
            m = re.match(r"\[(\d+)\] (.*)", line)
        else:
            m = re.match(r"loom-perf: rank (\d+): (.*)", line)
        if m:
            by_rank.setdefault(int(m.group(1)), []).append(m.group(2))
        elif launcher == "np" and not line.startswith("loom-perf --np:"):
            by_rank.setdefault(-1, []).append(line)  # a rank's line without a rank prefix
        else:
            own.append(line)
    return by_rank, own


def names_rank(lines: list[str], rank: int, pid: int) -> bool:
    """Whether these lines name `rank` as a peer, or name its pid."""
    text = "\n".join(lines)
    return str(rank) in PEER_RE.findall(text) or str(pid) in PID_RE.findall(text)


def naming_of_dead(by_rank: dict[int, list[str]], rank: int, dead: int, pid: int) -> str:
    """How `rank`'s messages lead to the dead rank: "yes" (named), "via rank P" (it names a
    peer P that gave up and whose own error names the dead rank), or "no"."""
    seen = {rank}
    path = []
    while True:
        lines = by_rank.get(rank, []) + by_rank.get(-1, [])
        referred = [int(p) for p in GAVE_UP_RE.findall("\n".join(lines))]
        direct = [line for line in lines if not GAVE_UP_RE.search(line)]
        if names_rank(direct, dead, pid):
            return "yes" if not path else "via rank " + " -> ".join(map(str, path))
        nxt = next((p for p in referred if p not in seen), None)
        if nxt is None:
            return "no"
        seen.add(nxt)
        path.append(nxt)
        rank = nxt


def launcher_names_rank(lines: list[str], rank: int) -> bool:
    return str(rank) in RANK_RE.findall("\n".join(lines))


def tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.splitlines()[-lines:])


# ----------------------------------------------------------------------------- trials

@dataclasses.dataclass
class Exit:
    """How one process of the job ended."""
    role: str                   # "rank N" or "launcher"
    pid: int
    status: str                 # "exit 1", "killed by SIGTERM", "still running", ...
    after_kill_s: float | None  # exit time minus kill time; None: did not exit
    names_dead_rank: str = "-"  # "yes", "via rank P", "no"; "-" for the killed rank


@dataclasses.dataclass
class Trial:
    index: int
    workload: str
    command: list[str]
    moment: str
    planned_s: float
    killed_rank: int = -1
    killed_pid: int = 0
    kill_s: float | None = None  # kill time after the launcher started
    rank_ended_s: float | None = None  # when the chosen rank ended by itself, if it did
    ranks_found_s: float | None = None
    exits: list[Exit] = dataclasses.field(default_factory=list)
    leftover_processes: list[str] = dataclasses.field(default_factory=list)
    leftover_shm: list[str] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)
    skipped: str = ""
    attempt: int = 1
    stderr_tail: str = ""
    action: str = "kill"         # "kill" (SIGKILL) or "stop" (SIGSTOP)

    @property
    def verdict(self) -> str:
        return "fail" if self.failures else ("skip" if self.skipped else "pass")


def plan_kill(moment: str, workload: Workload, rng: random.Random) -> float:
    """Seconds after the launcher starts at which to kill. Set-up spans the programs'
    loading, the store rendezvous and the shm segment's creation and attachment."""
    if moment == "setup":
        return rng.uniform(0.002, 1.2 * workload.setup_s)
    if moment == "mid":
        return rng.uniform(0.3, 0.7) * workload.duration_s
    return rng.uniform(0.8, 0.95) * workload.duration_s


def open_pidfds(ranks: dict[int, int]) -> dict[int, int]:
    fds = {}
    for rank, pid in ranks.items():
        try:
            fds[rank] = os.pidfd_open(pid)
        except OSError:
            pass  # already gone and reaped
    return fds


def kill_rank(trial: Trial, pidfd: int, start: float) -> float | None:
    """SIGKILLs the chosen rank at its planned moment; returns the kill time, or None
    when it exited first (then trial.rank_ended_s says when)."""
    delay = max(0.0, start + trial.planned_s - time.monotonic())
    if select.select([pidfd], [], [], delay)[0]:  # a pidfd is readable once it exited
        trial.rank_ended_s = time.monotonic() - start
        return None
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:  # it exited between the wait and the kill
        trial.rank_ended_s = time.monotonic() - start
        return None
    killed_at = time.monotonic()
    trial.kill_s = killed_at - start
    return killed_at


def record_exits(trial: Trial, launcher: subprocess.Popen, rank_fds: dict[int, int],
                 ranks: dict[int, int], exited: dict[str, float], killed_at: float) -> None:
    for rank, fd in sorted(rank_fds.items()):
        label = f"rank {rank}"
        when = exited.get(label)
        status = describe_status(exit_status(fd)) if when is not None else "still running"
        trial.exits.append(Exit(role=label, pid=ranks[rank], status=status,
                                after_kill_s=None if when is None else when - killed_at))
    when = exited.get("launcher")
    status = f"exit {launcher.returncode}" if launcher.returncode is not None else "still running"
    if launcher.returncode is not None and launcher.returncode < 0:
        status = f"killed by {signal.Signals(-launcher.returncode).name}"
    trial.exits.append(Exit(role="launcher", pid=launcher.pid, status=status,
                            after_kill_s=None if when is None else when - killed_at))


def judge(trial: Trial, stderr: str, launcher_kind: str) -> None:
    """Fills in names_dead_rank and the trial's failures (or marks it skipped when the
    chosen rank finished on its own just as the kill was sent)."""
    by_rank, own = split_output(stderr, launcher_kind)
    victim = f"rank {trial.killed_rank}"
    for e in trial.exits:
        if e.role == victim and e.status.startswith("exit "):
            trial.skipped = f"the chosen rank exited on its own ({e.status}) as it was killed"
    for e in trial.exits:
        if e.after_kill_s is None or e.after_kill_s > BOUND_S:
            when = "not at all" if e.after_kill_s is None else f"{e.after_kill_s:.2f} s"
            trial.failures.append(f"{e.role} exited {when} after the kill "
                                  f"(bound {BOUND_S:g} s)")
        if trial.skipped or e.role == victim:
            continue
        if e.role == "launcher":
            e.names_dead_rank = "yes" if launcher_names_rank(own, trial.killed_rank) else "no"
            if e.status == "exit 0":
                trial.failures.append("launcher exited 0 although a rank was killed")
            if e.names_dead_rank == "no":
                trial.failures.append("launcher's messages do not name the killed rank")
        else:
            rank = int(e.role.split()[1])
            e.names_dead_rank = naming_of_dead(by_rank, rank, trial.killed_rank,
                                               trial.killed_pid)
            own_error = e.status.startswith("exit ") and e.status != "exit 0"
            if own_error and e.names_dead_rank == "no":
                trial.failures.append(f"{e.role} exited with an error ({e.status}) "
                                      "without naming the dead rank")
    if trial.leftover_processes:
        trial.failures.append(f"{len(trial.leftover_processes)} process(es) left running")
    if trial.leftover_shm:
        trial.failures.append(f"/dev/shm entries left: {', '.join(trial.leftover_shm)}")


def observe(trial: Trial, launcher: subprocess.Popen, ranks: dict[int, int],
            rank_fds: dict[int, int], killed_at: float) -> None:
    """Watches every rank and the launcher exit (or the bound pass) and records how."""
    pidfds = {f"rank {r}": fd for r, fd in rank_fds.items()}
    launcher_fd = os.pidfd_open(launcher.pid)
    pidfds["launcher"] = launcher_fd
    exited = watch_exits(pidfds, killed_at + BOUND_S + OBSERVE_EXTRA_S)
    os.close(launcher_fd)
    if "launcher" in exited:
        launcher.wait()
    record_exits(trial, launcher, rank_fds, ranks, exited, killed_at)


def run_trial(index: int, workload: Workload, moment: str, build: Path,
              rng: random.Random, work_dir: Path) -> Trial:
    command = workload.command(build)
    trial = Trial(index=index, workload=workload.name, command=command, moment=moment,
                  planned_s=plan_kill(moment, workload, rng))
    victim = rng.randrange(workload.world)
    tag = uuid.uuid4().hex
    out_dir = Path(tempfile.mkdtemp(prefix=f"trial-{index:03d}-", dir=work_dir))
    shm_before = shm_entries()
    launcher, start = start_job(command, tag, out_dir)
    ranks = discover_ranks(launcher, workload.world)
    trial.ranks_found_s = time.monotonic() - start
    rank_fds = open_pidfds(ranks)
    killed_at = None
    if len(rank_fds) == workload.world:
        trial.killed_rank, trial.killed_pid = victim, ranks[victim]
        killed_at = kill_rank(trial, rank_fds[victim], start)
        if killed_at is None:
            trial.skipped = (f"the chosen rank ended {trial.rank_ended_s:.3f} s after start, "
                             "before the kill was due")
            workload.duration_s = trial.rank_ended_s  # the machine got faster: replan
            try:
                launcher.wait(timeout=BOUND_S + OBSERVE_EXTRA_S)
            except subprocess.TimeoutExpired:
                trial.failures.append("the job did not finish although no rank was killed")
    else:
        trial.failures.append(f"found only ranks {sorted(ranks)} of {workload.world} "
                              f"(launcher: {launcher.poll()})")
    if killed_at is not None:
        observe(trial, launcher, ranks, rank_fds, killed_at)
        trial.leftover_processes = [describe_process(p) for p in tagged_processes(tag)]
    clean_up(launcher, rank_fds, tag)
    leaked = leaked_shm(shm_before)
    stderr = (out_dir / "stderr.txt").read_text(errors="replace")
    trial.stderr_tail = tail(stderr)
    if killed_at is not None:
        trial.leftover_shm = leaked
        judge(trial, stderr, workload.launcher)
    for fd in rank_fds.values():
        os.close(fd)
    return trial


def run_stop_trial(index: int, workload: Workload, build: Path, rng: random.Random,
                   work_dir: Path) -> Trial:
    """SIGSTOPs one rank mid-run (a spawned one of a self-spawned job) and checks that the
    whole job exits non-zero within STOP_BOUND_S and leaves nothing behind."""
    out_dir = Path(tempfile.mkdtemp(prefix=f"trial-{index:03d}-", dir=work_dir))
    # rank 0 logs every step as it ends (flushed): tells a stop after the last step
    command = workload.command(build) + ["--metrics", str(out_dir / "metrics.jsonl")]
    trial = Trial(index=index, workload=workload.name, command=command, moment="mid",
                  planned_s=plan_kill("mid", workload, rng), action="stop")
    self_spawned = workload.launcher == "self"
    victim = rng.randrange(1 if self_spawned else 0, workload.world)
    tag = uuid.uuid4().hex
    shm_before = shm_entries()
    launcher, start = start_job(command, tag, out_dir)
    ranks = discover_ranks(launcher, workload.world, self_spawned)
    trial.ranks_found_s = time.monotonic() - start
    rank_fds = open_pidfds({r: p for r, p in ranks.items() if not (self_spawned and r == 0)})
    stopped_at = None
    try:
        if len(ranks) == workload.world and victim in rank_fds:
            trial.killed_rank, trial.killed_pid = victim, ranks[victim]
            delay = max(0.0, start + trial.planned_s - time.monotonic())
            ended = bool(select.select([rank_fds[victim]], [], [], delay)[0])
            if not ended:
                try:
                    signal.pidfd_send_signal(rank_fds[victim], signal.SIGSTOP)
                    stopped_at = time.monotonic()
                    trial.kill_s = stopped_at - start
                except ProcessLookupError:  # it exited between the wait and the stop
                    ended = True
            if ended:
                trial.rank_ended_s = time.monotonic() - start
                trial.skipped = (f"the chosen rank ended {trial.rank_ended_s:.3f} s after start, "
                                 "before the stop was due")
                workload.duration_s = trial.rank_ended_s
        else:
            trial.failures.append(f"found only ranks {sorted(ranks)} of {workload.world} "
                                  f"(launcher: {launcher.poll()})")
        if stopped_at is not None:
            launcher_fd = os.pidfd_open(launcher.pid)
            exited = watch_exits({"job": launcher_fd}, stopped_at + STOP_BOUND_S)
            os.close(launcher_fd)
            if "job" in exited:
                launcher.wait()
                if launcher.returncode < 0:
                    status = f"killed by {signal.Signals(-launcher.returncode).name}"
                else:
                    status = f"exit {launcher.returncode}"
                trial.exits.append(Exit(role="job", pid=launcher.pid, status=status,
                                        after_kill_s=exited["job"] - stopped_at))
                if launcher.returncode == 0:
                    trial.failures.append("the job exited 0 although a rank was stopped")
                # the job's processes get a moment to go (a launcher's last SIGKILL lands)
                deadline = time.monotonic() + 1.0
                while tagged_processes(tag) and time.monotonic() < deadline:
                    time.sleep(0.05)
                trial.leftover_processes = [describe_process(p)
                                            for p in tagged_processes(tag)]
            else:
                trial.exits.append(Exit(role="job", pid=launcher.pid, status="still running",
                                        after_kill_s=None))
                trial.failures.append(f"the job was still running {STOP_BOUND_S:g} s after "
                                      f"rank {victim} was stopped (bound: --timeout "
                                      f"{STOP_TIMEOUT_S:g} s + {STOP_GRACE_S:g} s)")
                trial.leftover_processes = [describe_process(p)
                                            for p in tagged_processes(tag)]
    finally:
        if victim in rank_fds:  # let the stopped rank go: SIGCONT, then SIGKILL
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    signal.pidfd_send_signal(rank_fds[victim], sig)
                except OSError:
                    pass
        clean_up(launcher, rank_fds, tag)
    leaked = leaked_shm(shm_before)
    stderr = (out_dir / "stderr.txt").read_text(errors="replace")
    trial.stderr_tail = tail(stderr)
    finished = finished_before_stop(out_dir, rank_fds, victim, self_spawned, workload.scale)
    if stopped_at is not None and finished:
        # no collective was left to time out: the job waits for the stopped rank for ever,
        # as any launcher would; plan the next try earlier
        trial.skipped = f"{finished} had finished its run when the stop landed"
        trial.failures.clear()
        trial.exits.clear()
        workload.duration_s = stopped_at - start
        stopped_at = None
    if stopped_at is not None:
        trial.leftover_shm = leaked
        named = str(victim) in PEER_RE.findall(stderr) or \
            str(trial.killed_pid) in PID_RE.findall(stderr)
        trial.exits[0].names_dead_rank = "yes" if named else "no"
        if trial.leftover_processes:
            trial.failures.append(f"{len(trial.leftover_processes)} process(es) left running")
        if trial.leftover_shm:
            trial.failures.append(f"/dev/shm entries left: {', '.join(trial.leftover_shm)}")
    for fd in rank_fds.values():
        os.close(fd)
    return trial


def finished_before_stop(out_dir: Path, rank_fds: dict[int, int], victim: int,
                         self_spawned: bool, steps: int) -> str:
    """Which other rank, if any, had completed its training before the stop landed: it
    exited 0, logged its last step in --metrics (rank 0), or printed train_gpt's closing
    summary line (loomrun prefixes a rank's lines with "[R] "; a self-spawned job's rank 0
    prints unprefixed)."""
    if victim != 0:
        try:
            logged = (out_dir / "metrics.jsonl").read_text().count("\n")
        except OSError:
            logged = 0
        if logged >= steps:
            return f"rank 0 (logged all {steps} steps)"
    for rank, fd in rank_fds.items():
        status = exit_status(fd)
        if rank != victim and status is not None and os.WIFEXITED(status) \
                and os.WEXITSTATUS(status) == 0:
            return f"rank {rank} (exit 0)"
    stdout = (out_dir / "stdout.txt").read_text(errors="replace")
    for m in re.finditer(r"^(?:\[(\d+)\] )?summary: ", stdout, re.M):
        rank = int(m.group(1)) if m.group(1) else (0 if self_spawned else -1)
        if rank != victim:
            return f"rank {rank} (its summary line)"
    return ""


# ----------------------------------------------------------------------------- calibration

@dataclasses.dataclass
class UnkilledRun:
    exit_code: int
    seconds: float
    attached_s: float | None  # when the shm segment's name went away: every rank attached
    stderr_tail: str


def run_unkilled(workload: Workload, build: Path, work_dir: Path) -> UnkilledRun:
    """Runs the workload to completion, watching /dev/shm for the backend's segment."""
    out_dir = Path(tempfile.mkdtemp(prefix="calibrate-", dir=work_dir))
    tag = uuid.uuid4().hex
    before = shm_entries()
    launcher, start = start_job(workload.command(build), tag, out_dir)
    created = attached = None
    while launcher.poll() is None and time.monotonic() - start < 120:
        segment = any(name.startswith("loom-") for name in shm_entries() - before)
        if segment and created is None:
            created = time.monotonic() - start
        if created is not None and not segment and attached is None:
            attached = time.monotonic() - start
        time.sleep(0.001)
    seconds = time.monotonic() - start
    clean_up(launcher, {}, tag)
    code = launcher.returncode if launcher.returncode is not None else -1
    return UnkilledRun(code, seconds, attached,
                       tail((out_dir / "stderr.txt").read_text(errors="replace")))


def calibrate(workload: Workload, build: Path, work_dir: Path, target_s: float) -> str | None:
    """Scales the workload to last about target_s (start-up time makes the first guesses
    short, so up to four runs) and measures its set-up time; returns an error text if an
    unkilled run fails."""
    for _ in range(4):
        run = run_unkilled(workload, build, work_dir)
        workload.duration_s = run.seconds
        if run.attached_s is not None:
            workload.setup_s = run.attached_s
        if run.exit_code != 0:
            return f"unkilled run of {workload.name} exited {run.exit_code}:\n{run.stderr_tail}"
        if run.seconds >= 0.75 * target_s:
            break
        workload.scale = int(workload.scale * min(20.0, target_s / max(run.seconds, 0.01)))
    return None


# ----------------------------------------------------------------------------- report

def print_trial_line(trial: Trial) -> None:
    kill = f"{trial.kill_s:.3f}" if trial.kill_s is not None else "-"
    exits = ", ".join(
        f"{e.role} {e.status} +{e.after_kill_s:.3f}s" if e.after_kill_s is not None
        else f"{e.role} {e.status}" for e in trial.exits)
    again = f" (attempt {trial.attempt})" if trial.attempt > 1 else ""
    print(f"[{trial.index:3d}] {trial.verdict:4s}{again} {trial.workload:32s} {trial.moment:5s} "
          f"{trial.action} rank {trial.killed_rank} at {kill}s | {exits or trial.skipped}",
          flush=True)


def print_summary(trials: list[Trial], baseline_errors: list[str]) -> None:
    print("\n== summary ==")
    counts: dict[str, dict[str, int]] = {}
    for t in trials:
        row = counts.setdefault(t.workload, {"trials": 0, "pass": 0, "fail": 0, "skip": 0})
        row["trials"] += 1
        row[t.verdict] += 1
    print(f"{'workload':34s} trials  pass  fail  skip")
    for name, row in counts.items():
        print(f"{name:34s} {row['trials']:6d} {row['pass']:5d} {row['fail']:5d} {row['skip']:5d}")
    total = {k: sum(r[k] for r in counts.values()) for k in ("trials", "pass", "fail", "skip")}
    print(f"{'total':34s} {total['trials']:6d} {total['pass']:5d} {total['fail']:5d} "
          f"{total['skip']:5d}")
    stops = [e.after_kill_s for t in trials if t.action == "stop" and not t.skipped
             for e in t.exits if e.after_kill_s is not None]
    if stops:
        stops.sort()
        print(f"\nstop trials: the job exited {stops[len(stops) // 2]:.2f} s (median), "
              f"{stops[-1]:.2f} s (max) after the stop (bound {STOP_BOUND_S:g} s)")
    print_survivor_tally(trials)
    for error in baseline_errors:
        print(f"\nBASELINE FAILURE: {error}")
    for t in trials:
        if t.verdict != "fail":
            continue
        done = "killed" if t.action == "kill" else "stopped"
        kill = f"not {done}" if t.kill_s is None else f"{done} {t.kill_s:.3f} s after start"
        print(f"\nFAILURE trial {t.index}: {t.workload}, {t.moment}, rank {t.killed_rank} "
              f"(pid {t.killed_pid}) {kill} (ranks found at {t.ranks_found_s:.3f} s)")
        print("  command: " + " ".join(t.command))
        for reason in t.failures:
            print(f"  - {reason}")
        for e in t.exits:
            after = f"{e.after_kill_s:+.3f} s" if e.after_kill_s is not None else "never"
            print(f"    {e.role:9s} pid {e.pid:<7d} {e.status:28s} {after:>10s} "
                  f"names dead rank: {e.names_dead_rank}")
        for p in t.leftover_processes:
            print(f"    leftover: {p}")
        print("  stderr tail:\n    " + t.stderr_tail.replace("\n", "\n    "))


def print_survivor_tally(trials: list[Trial]) -> None:
    """How the surviving ranks of the trials with a kill ended, and whether they named it."""
    tally: dict[str, int] = {}
    for t in trials:
        if t.kill_s is None or t.skipped or t.action != "kill":
            continue
        for e in t.exits:
            if e.role.startswith("rank ") and e.role != f"rank {t.killed_rank}":
                key = f"{e.status}, names the dead rank: {e.names_dead_rank}"
                tally[key] = tally.get(key, 0) + 1
    print("\nsurviving ranks:")
    for key, count in sorted(tally.items(), key=lambda item: -item[1]):
        print(f"  {count:4d}  {key}")


def write_json(path: Path, trials: list[Trial], baseline_errors: list[str], seed: int) -> None:
    data = {"seed": seed, "timeout_s": TIMEOUT_S, "bound_s": BOUND_S,
            "stop_timeout_s": STOP_TIMEOUT_S, "stop_bound_s": STOP_BOUND_S,
            "baseline_errors": baseline_errors,
            "trials": [dict(dataclasses.asdict(t), verdict=t.verdict) for t in trials]}
    path.write_text(json.dumps(data, indent=2))


# ----------------------------------------------------------------------------- main

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", type=Path, default=Path("build/release"),
                        help="build directory holding tools/ (default: build/release)")
    parser.add_argument("--trials", type=int, default=60, help="kill trials (default 60)")
    parser.add_argument("--stops", type=int, default=6,
                        help="stop trials, round-robin over the 3 stop workloads (default 6)")
    parser.add_argument("--seed", type=int, default=None, help="default: random, printed")
    parser.add_argument("--json", type=Path, help="also write every trial here")
    parser.add_argument("--launcher", choices=["loomrun", "np"], default="loomrun",
                        help="what starts the loom-perf ranks (the train_gpt kill workload always "
                             "uses loomrun)")
    parser.add_argument("--target-s", type=float, default=None,
                        help="about how long an unkilled run should last (default 2; 1 with "
                             "--ci)")
    parser.add_argument("--ci", action="store_true",
                        help=f"CI: seed {CI_SEED}, {CI_KILLS} kills on {len(CI_KILL_WORKLOADS)} "
                             f"workloads, {CI_STOPS} stops (under 2 minutes)")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep every trial's stdout/stderr (the folder is printed)")
    return parser.parse_args()


def plan_trials(args: argparse.Namespace) -> list[tuple[Workload, str]]:
    """(workload, moment) of every trial, in order: the kills round-robin over the kill
    workloads (moments cycling setup, mid, end by round), then the stops round-robin over
    the stop workloads (always mid-run)."""
    kills = make_workloads(args.launcher)
    if args.ci:
        kills = [w for name in CI_KILL_WORKLOADS for w in kills if w.name == name]
    stops = make_stop_workloads()
    plan = [(kills[i % len(kills)], MOMENTS[(i // len(kills)) % len(MOMENTS)])
            for i in range(args.trials)]
    return plan + [(stops[i % len(stops)], "mid") for i in range(args.stops)]


def main() -> int:
    args = parse_args()
    started = time.monotonic()
    if args.ci:
        args.trials, args.stops = CI_KILLS, CI_STOPS
        args.seed = CI_SEED if args.seed is None else args.seed
    target_s = args.target_s or (1.0 if args.ci else 2.0)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    work_dir = Path(tempfile.mkdtemp(prefix="kill_a_rank-"))
    print(f"kill_a_rank{' (ci)' if args.ci else ''}: {args.trials} kill and {args.stops} stop "
          f"trials, seed {seed}, bound {BOUND_S:g} s (stops: {STOP_BOUND_S:g} s), logs in "
          f"{work_dir}", flush=True)
    programs = snapshot_programs(args.build, work_dir / "programs")
    for relative in PROGRAMS:
        built = time.localtime((programs / relative).stat().st_mtime)
        print(f"  testing a copy of {args.build / relative}, built "
              f"{time.strftime('%Y-%m-%d %H:%M:%S', built)}", flush=True)
    baseline_errors: list[str] = []
    trials: list[Trial] = []
    try:
        for index, (workload, moment) in enumerate(plan_trials(args)):
            if workload.duration_s == 0.0:
                error = calibrate(workload, programs, work_dir, target_s)
                print(f"      calibrated {workload.name}: scale {workload.scale}, "
                      f"{workload.duration_s:.2f} s, set-up {workload.setup_s:.3f} s"
                      + (" FAILED" if error else ""), flush=True)
                if error:
                    baseline_errors.append(error)
                if workload.action == "stop":
                    # three times the steps, the stop still planned in the calibrated run's
                    # middle: it lands mid-run even if the machine gets 3x faster
                    workload.scale *= STOP_SCALE
            for attempt in range(1 + SKIP_RETRIES):  # a skipped trial is tried again
                if workload.action == "stop":
                    trial = run_stop_trial(index, workload, programs, rng, work_dir)
                else:
                    trial = run_trial(index, workload, moment, programs, rng, work_dir)
                trial.attempt = attempt + 1
                print_trial_line(trial)
                if trial.verdict != "skip":
                    break
            trials.append(trial)
    finally:
        if not args.keep_logs:
            shutil.rmtree(work_dir, ignore_errors=True)
    print_summary(trials, baseline_errors)
    if args.json:
        write_json(args.json, trials, baseline_errors, seed)
    kills = sum(1 for t in trials if t.action == "kill" and t.kill_s is not None)
    stops = sum(1 for t in trials if t.action == "stop" and t.kill_s is not None)
    failed = sum(1 for t in trials if t.verdict == "fail") + len(baseline_errors)
    short = []
    if args.ci and kills < 20:
        short.append(f"only {kills} kills landed (CI needs 20)")
    if args.ci and stops < 2:
        short.append(f"only {stops} stops landed (CI needs 2)")
    for line in short:
        print(f"\nCI FAILURE: {line}")
    elapsed = time.monotonic() - started
    print(f"\nkill_a_rank{' ci' if args.ci else ''}: {len(trials)} trials, {kills} kills, "
          f"{stops} stops, {failed} failed, {elapsed:.0f} s")
    return 1 if failed or short else 0


if __name__ == "__main__":
    sys.exit(main())
