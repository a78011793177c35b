#!/usr/bin/env python3
"""The skip ledger's judge: no test passes by being skipped unless the ledger allows it here.

    python3 tests/skips/check_skips.py --junit BUILD/ctest-junit.xml --preset release
                                       [--ledger tests/skips/ledger.toml] [--facts]

ctest counts a skipped test (SKIP_RETURN_CODE 77, or GoogleTest's "[  SKIPPED ]") as a success
and exits 0. This script reads the JUnit file ctest wrote (`ctest --output-junit`), and for
every skipped test finds the ledger entry that names it. It fails (exit 1) when
  - a test skipped that no ledger entry names (a new skip must be argued for in the ledger);
  - a test skipped under an entry none of whose conditions holds on this machine and build
    (a root machine with network namespaces must run the multi-host tests; a machine with a
    GPU must run the CUDA tests; ...);
  - the JUnit file is missing or lists no test.
A suite that is not built for a missing dependency registers one placeholder test that
skips naming it (`<suite>.absent`, tests/CMakeLists.txt), so an absent suite is judged the
same way. Conditions are facts this script finds out itself (never from the tests' own
messages): see FACTS below; `--facts` prints them and exits.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def gpu_count() -> int:
    """GPUs the NVIDIA driver exposes to this process (CUDA_VISIBLE_DEVICES honoured)."""
    found = len(glob.glob("/proc/driver/nvidia/gpus/*"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        found = min(found, len([v for v in visible.split(",") if v.strip() not in ("", "-1")]))
    return found


def can_make_network_namespace() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    name = f"loomskip{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return made


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def has_non_loopback_ipv4() -> bool:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True)
    return any(not a.startswith("127.") for a in re.findall(r"inet (\S+)/", out.stdout))


def has_header(name: str, extra_dirs: tuple[str, ...] = ()) -> bool:
    dirs = ("/usr/include", "/usr/local/include", "/usr/local/cuda/include",
            "/usr/include/x86_64-linux-gnu") + extra_dirs
    return any(Path(d, name).exists() for d in dirs)


def cuda_include_dirs() -> tuple[str, ...]:
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    base = Path(nvcc).resolve().parent.parent
    return tuple(str(p) for p in [base / "include", *base.glob("targets/*/include")])


def python_has_safetensors() -> bool:
    python = ROOT / ".venv/bin/python"
    return python.exists() and subprocess.run(
        [str(python), "-c", "import safetensors, numpy"], capture_output=True).returncode == 0


def python_has_tokenizers() -> bool:
    python = ROOT / ".venv/bin/python"
    return python.exists() and subprocess.run(
        [str(python), "-c", "import tokenizers"], capture_output=True).returncode == 0


def io_uring_refused() -> bool:
    """io_uring_setup(2) refused (a seccomp filter, or kernel.io_uring_disabled)."""
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    fd = libc.syscall(425, 1, params)  # __NR_io_uring_setup on x86_64
    if fd >= 0:
        os.close(fd)
        return False
    return True


def direct_io_refused_in_tmp() -> bool:
    """O_DIRECT refused in the temporary directory (tmpfs before Linux 6.6 refuses it)."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        try:
            fd = os.open(os.path.join(d, "probe"), os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
        except OSError:
            return True
        os.close(fd)
        return False


# Every condition a ledger entry may name: true when the skip is allowed on this machine.
FACTS = {
    "no-gpu": lambda: gpu_count() == 0,
    "fewer-than-2-gpus": lambda: gpu_count() < 2,
    "has-gpu": lambda: gpu_count() > 0,
    "not-root": lambda: os.geteuid() != 0,
    "no-network-namespaces": lambda: not can_make_network_namespace(),
    "no-mpirun": lambda: shutil.which("mpirun") is None,
    "no-slurm": lambda: any(shutil.which(t) is None for t in
                            ("munged", "slurmctld", "slurmd", "srun", "sbatch", "sinfo")),
    "no-ucx": lambda: subprocess.run(["pkg-config", "--exists", "ucx"]).returncode != 0,
    "no-cuda-toolkit": lambda: not has_header("cuda_runtime.h", cuda_include_dirs()),
    "no-nvcc": lambda: shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
    "no-nccl": lambda: not has_header("nccl.h", cuda_include_dirs()),
    "no-ipv6-loopback": lambda: not has_ipv6_loopback(),
    "no-non-loopback-ipv4": lambda: not has_non_loopback_ipv4(),
    "no-python-safetensors": lambda: not python_has_safetensors(),
    "no-python-tokenizers": lambda: not python_has_tokenizers(),
    "no-dev-shm": lambda: not Path("/dev/shm").is_dir(),
    "flight-recorder-off": lambda: os.environ.get("LOOM_FLIGHT_RECORDER") == "0",
    "io-uring-refused": io_uring_refused,
    "direct-io-refused-in-tmp": direct_io_refused_in_tmp,
    "no-avx512": lambda: "avx512f" not in Path("/proc/cpuinfo").read_text(),
}
PRESETS = ("release", "debug", "asan", "tsan")


@cache
def fact(name: str, preset: str) -> bool:
    if name.startswith("preset:"):
        return name.removeprefix("preset:") == preset
    return bool(FACTS[name]())


def load_ledger(path: Path) -> list[dict]:
    entries = tomllib.loads(path.read_text()).get("skip", [])
    known = set(FACTS) | {f"preset:{p}" for p in PRESETS}
    for i, e in enumerate(entries):
        where = f"{path}: entry {i + 1}"
        for key in ("tests", "when", "reason"):
            if key not in e:
                sys.exit(f"check_skips: {where} has no '{key}'")
        for cond in e["when"]:
            if cond not in known:
                sys.exit(f"check_skips: {where} names the unknown condition '{cond}'; "
                         f"known: {', '.join(sorted(known))}")
        e["patterns"] = [re.compile(p) for p in e["tests"]]
    return entries


def skipped_tests(junit: Path) -> tuple[int, list[tuple[str, str]]]:
    """(tests run, [(name, ctest's skip message)]) from ctest's JUnit file."""
    if not junit.exists():
        sys.exit(f"check_skips: no JUnit file at {junit} (run ctest with --output-junit)")
    cases = ET.parse(junit).getroot().iter("testcase")
    total, skipped = 0, []
    for case in cases:
        total += 1
        mark = case.find("skipped")
        if mark is not None:
            # GoogleTest prints "FILE:LINE: Skipped", then the reason; a script's last line is its.
            out = [line.strip() for line in (case.findtext("system-out") or "").splitlines()]
            out = [line for line in out if line]
            after = [out[i + 1] for i, line in enumerate(out[:-1]) if line.endswith(": Skipped")]
            why = after[0] if after else (out[-1] if out else mark.get("message", ""))
            name = case.get("name", "?").split("  # ")[0]  # without "# GetParam() = ..."
            skipped.append((name, why[:160]))
    return total, skipped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junit", type=Path)
    parser.add_argument("--preset", choices=PRESETS, required=True)
    parser.add_argument("--ledger", type=Path, default=ROOT / "tests/skips/ledger.toml")
    parser.add_argument("--facts", action="store_true", help="print the conditions and exit")
    args = parser.parse_args()
    ledger = load_ledger(args.ledger)
    if args.facts:
        for name in sorted(FACTS):
            print(f"{name:24} {fact(name, args.preset)}")
        return 0
    if args.junit is None:
        parser.error("--junit is required")
    total, skipped = skipped_tests(args.junit)
    if total == 0:
        print(f"check_skips: {args.junit} lists no test")
        return 1
    problems, allowed = [], {}
    for name, why in skipped:
        entries = [e for e in ledger if any(p.search(name) for p in e["patterns"])]
        if not entries:
            problems.append(f"{name}: skipped ({why}), and no ledger entry allows it")
            continue
        holding = [e for e in entries if any(fact(c, args.preset) for c in e["when"])]
        if not holding:
            conds = " | ".join(c for e in entries for c in e["when"])
            problems.append(f"{name}: skipped ({why}), but the ledger allows it only when "
                            f"{conds}, which does not hold here")
            continue
        allowed.setdefault(holding[0]["reason"], []).append(name)
    print(f"check_skips: {total} tests, {len(skipped)} skipped ({args.preset} build)")
    for reason, names in allowed.items():
        print(f"  {len(names):4} allowed: {reason}")
    for p in problems:
        print(f"  NOT ALLOWED: {p}")
    if problems:
        print(f"check_skips: {len(problems)} skip(s) the ledger does not allow on this machine "
              f"({args.ledger.relative_to(ROOT)}; `--facts` shows the conditions)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
