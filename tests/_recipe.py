"""examples/README.md's recipe (tests/scripts/recipe_ddp.py, copied from it as a user would) run
live: its uninterrupted reference, when a preempted start came back, what `hpctrain logs` shows."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from datetime import datetime
from pathlib import Path

import pytest
from filelock import FileLock
from test_parallel_layouts import Home

from hpctrain.kernel import layout

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "tests" / "scripts" / "recipe_ddp.py"
STEPS, EVERY = 60, 10
TRAIN = ["--steps", str(STEPS), "--save-every", str(EVERY)]
NODES, GPUS = 2, 2  # 4 ranks: an exact resume beyond 2 needs runtime.fix_ddp_buckets
BACK_S = 10  # the bound: preempted and running again within 10 s of the save
DONE = re.compile(r"done: (\d+) steps, params sha256 ([0-9a-f]{64})")
# what a routine preempt must not show in `hpctrain logs` (the raw node logs keep them)
NOISE = re.compile(r"Traceback|exitcode: 75|^\[[EWI]\d{4} |^frame #\d+|SignalException", re.M)


def lines(path: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except OSError:
        return []


def state(run: Path) -> str:
    try:
        return str(json.loads((run / "state.json").read_text())["state"])
    except (OSError, ValueError, KeyError):
        return "PENDING"


def steps(run: Path) -> list[int]:
    return [r["step"] for r in lines(run / layout.METRICS) if "loss" in r]


def final_hash(run: Path) -> str:
    """The params hash rank 0 printed at the end (the last start's)."""
    found = [
        m for f in sorted((run / "logs").glob("node-*.log")) for m in DONE.findall(f.read_text())
    ]
    assert found, f"no `done:` line in {run}/logs"
    assert int(found[-1][0]) == STEPS, found
    return found[-1][1]


def reference(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The uninterrupted run, local profile, the same 4 ranks, trained once per test session:
    tests/test_recipe.py and tests/test_recipe_slurm.py compare with it, and under pytest-xdist its
    folder and lock are in the session's folder above each worker's own (as tests/_demo.py)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    home = Home(root / "recipe-ref")
    run = home.root / "runs" / "ref"
    with FileLock(root / "recipe-ref.lock"):
        if state(run) != "COMPLETED":
            shutil.rmtree(home.root, ignore_errors=True)  # a half-built one of a failed try
            home.root.mkdir()
            home.hp(
                "submit", "--profile", "local", "--nodes", str(NODES), "--gpus", str(GPUS),
                "--name", "ref", "--script", str(RECIPE), "--wait", "--", *TRAIN,
            )  # fmt: skip
    return final_hash(run)


def wait_step(run: Path, step: int, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not steps(run) or steps(run)[-1] < step:
        assert time.monotonic() < deadline, f"{run.name} not at step {step} in {timeout} s"
        assert steps(run)[-1:] != [STEPS], f"{run.name} ended before step {step}"
        time.sleep(0.05)


def _iso(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def back_after_save(run: Path) -> tuple[float, float]:
    """(seconds from the stop's save to the `requeue` event, to the next start of the batch
    script). The save's time from saves.jsonl; the others are whole seconds (+-1 s)."""
    events = lines(run / layout.EVENTS)
    stopped = next(e for e in events if e["event"] == "preempted")
    saved = next(s["time"] for s in lines(run / layout.SAVES) if s["step"] == stopped["step"])
    requeued = next(e for e in events if e["event"] == "requeue")
    started = next(r for r in lines(run / layout.RESTARTS) if r["restart_count"] == 1)
    return _iso(requeued["time"]) - saved, _iso(started["time"]) - saved
