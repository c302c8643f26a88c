"""Helpers shared by tests/test_faults.py and tests/test_fault_runs.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.kernel import jobenv

REPO = Path(__file__).resolve().parent.parent


def hp_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(jobenv.PREFIX)}
    return env | {
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "OMP_NUM_THREADS": "1",
    }


def hpctrain(
    home: Path, *args: str, ok: bool | None = True, timeout: float = 300
) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        capture_output=True,
        text=True,
        env=hp_env(home),
        cwd=home,
        timeout=timeout,
    )
    assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    if ok is not None:
        assert (out.returncode == 0) == ok, (
            f"{args} -> {out.returncode}\n{out.stdout}\n{out.stderr}"
        )
    return out


def fill(folder: Path, leave: int = 0) -> Path:
    """Write a filler file until at most `leave` bytes are free."""
    filler = folder / "filler"
    with open(filler, "ab") as f:
        while (free := shutil.disk_usage(folder).free) > leave:
            try:
                f.write(b"\0" * min(1 << 20, max(4096, free - leave)))
                f.flush()
            except OSError:
                break
    return filler


def wait_for(predicate, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
