"""One local run (1 node x 2 ranks, the demo's 60 steps, a checkpoint every 20) preempted with
`hpctrain preempt` at a random step and requeued by its batch shell to the end, run once per test
session and read by two files: tests/test_preempt_cli.py (the chain: events, restarts, the resume
point, status) and tests/test_in_job_restart.py (torchrun does not restart the workers that left 75).
Under pytest-xdist its folder and lock are in the session's folder above each worker's own (as
_demo.demo_run), so the file on the other worker waits for it instead of preempting a run again."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from _demo import STEPS
from _hold import held
from filelock import FileLock

from hpctrain import dispatch
from hpctrain.kernel import jobenv
from hpctrain.runs.folder import RunDir

SEED = int(os.environ.get(jobenv.TEST_SEED, time.time_ns() % 10_000))
NAME = "pre"


def hp(home: Path, *args: str) -> subprocess.CompletedProcess:
    """`hpctrain ...` in `home`, with its own state and config."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (jobenv.STOP_AT_STEP, jobenv.STOP_FILE, jobenv.RUN_DIR)
    } | {
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "OMP_NUM_THREADS": "1",
    }
    out = subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=home,
        timeout=300,
    )
    assert out.returncode == 0, f"hpctrain {' '.join(args)}:\n{out.stdout}\n{out.stderr}"
    return out


def last_step(run: Path) -> int:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError):
            continue
    return 0


@dataclass(frozen=True)
class Preempted:
    home: Path
    at: int  # the step reached when `hpctrain preempt` was sent (every rank held still)
    seed: int
    said: str  # what `hpctrain preempt` printed
    final: str  # the state the job ended in

    @property
    def run(self) -> Path:
        return self.home / "runs" / NAME

    def hp(self, *args: str) -> subprocess.CompletedProcess:
        return hp(self.home, *args)


def preempted_run(tmp_path_factory: pytest.TempPathFactory) -> Preempted:
    """The run, ended (read it, never write to it)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    home, record = root / "preempted", root / "preempted.json"
    with FileLock(root / "preempted.lock"):
        if not record.is_file():
            shutil.rmtree(home, ignore_errors=True)  # a half-done one of a failed try
            home.mkdir()
            hp(home, "submit", "--profile", "local", "--nodes", "1", "--gpus", "2",
               "--name", NAME, "--", "--max-steps", str(STEPS), "--checkpoint-every", "20")  # fmt: skip
            run = home / "runs" / NAME
            at = random.Random(SEED).randint(2, 12)
            deadline = time.monotonic() + 180
            while last_step(run) < at:
                assert time.monotonic() < deadline, f"timed out waiting for step {at} (seed {SEED})"
                time.sleep(0.005)
            with held(run):  # the preempt lands mid-run however slow it is under load
                said = hp(home, "preempt", NAME).stdout
            final = dispatch.wait(RunDir(run), poll_s=0.5)
            record.write_text(json.dumps({"at": at, "seed": SEED, "said": said, "final": final}))
    return Preempted(home=home, **json.loads(record.read_text()))
