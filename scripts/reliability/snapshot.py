"""Private copies of the programs a campaign runs, so that a rebuild of the build tree during
the campaign cannot swap or truncate them mid-run (bad_inputs.py, kill_a_rank.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path


def copy_settled(source: Path, target: Path, deadline: float, who: str) -> None:
    """Copies `source` to `target` once it is settled: not empty, not modified in the last
    5 s (a link still writing it), and answering --help without a crash. Waits until
    `deadline` (time.monotonic()), then exits naming the program."""
    target.parent.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            info = source.stat()
            settled = info.st_size > 0 and time.time() - info.st_mtime > 5
        except OSError:
            settled = False
        if settled:
            shutil.copy2(source, target)
            check = subprocess.run([str(target), "--help"], capture_output=True)
            if check.returncode < 128:  # loom-trace's --help is a usage line (exit 2)
                return
        if time.monotonic() > deadline:
            sys.exit(f"{who}: {source} is missing or not runnable; build Loom first")
        time.sleep(1.0)
