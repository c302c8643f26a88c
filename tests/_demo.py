"""The demo's uninterrupted runs, `torchrun --nproc-per-node 2 -m train_entry --strategy S
--max-steps 60` (the issue's command), trained once per test session and shared: tests/
test_train_e2e.py checks them and resumes against them; test_preempt_cli.py and
test_in_job_restart.py (and test_in_job_slurm.py through it) compare final hashes with them. Neither a
checkpoint cadence, snapshots, nor the local profile's launch (1 node x 2 ranks or 2 x 1) changes
the hash (seen equal for ddp and fsdp). Under pytest-xdist the folders and their locks are in the
session's folder above each worker's own (as test_parallel_layouts.reference_run), so a file on the
other worker never trains one again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from hpctrain.kernel import jobenv, layout

REPO = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
STEPS = 60


def env(**extra: str) -> dict:
    e = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith((jobenv.PREFIX, "RANK", "WORLD_SIZE", "MASTER_", "LOCAL_RANK"))
    }
    e.update(
        OMP_NUM_THREADS="1",
        DS_ACCELERATOR="cpu",
        **{jobenv.DEVICE: "cpu"},
        PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}",
        **extra,
    )
    return e


def train(
    run_dir: Path, *args: str, nproc: int = 2, extra_env: dict | None = None, expect: int = 0
) -> subprocess.CompletedProcess:
    launcher = (
        [TORCHRUN, "--standalone", "--nproc-per-node", str(nproc)]
        if nproc > 1
        else [sys.executable]
    )
    cmd = [*launcher, "-m", "train_entry", "--run-dir", str(run_dir), *args]
    res = subprocess.run(
        cmd, capture_output=True, text=True, env=env(**(extra_env or {})), timeout=240
    )
    assert res.returncode == expect, (
        f"{' '.join(cmd)} -> {res.returncode}\n{res.stdout}\n{res.stderr[-4000:]}"
    )
    return res


def demo_run(tmp_path_factory: pytest.TempPathFactory, strategy: str) -> Path:
    """`strategy`'s uninterrupted 60-step run (read it, never write to it)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    run = root / f"demo-{strategy}"
    with FileLock(root / f"demo-{strategy}.lock"):
        if not (run / layout.FINAL_PARAMS).is_file():
            shutil.rmtree(run, ignore_errors=True)  # a half-built one of a failed try
            train(run, "--strategy", strategy, "--max-steps", str(STEPS))
    return run
