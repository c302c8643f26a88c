"""train_entry/stepsync.py: the step's one collective (loss sum + stop votes), read one step later,
and the stop it carries seen by every rank at the same step; the CPU heap setting of dist.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpctrain.kernel import jobenv
from train_entry.preempt import StopFlag
from train_entry.stepsync import Boundary, StepSync

REPO = Path(__file__).resolve().parent.parent


def boundary(step: int, loss: float, *, vote: bool = False, log: bool = True) -> Boundary:
    return Boundary(
        step=step, loss_sum=torch.tensor(loss), grad_norm=0.5, lr=1e-3, vote=vote, log=log
    )


def test_one_process_launch_collect_now():
    sync = StepSync(torch.device("cpu"), rank=0, world_size=1)
    assert sync.collect() is None  # nothing pending at the first boundary
    b = boundary(1, 2.5, vote=True)
    sync.launch(b)
    with pytest.raises(AssertionError):
        sync.launch(boundary(2, 1.0))  # one pending at a time: collect first
    done = sync.collect()
    assert done is b and done.loss == 2.5 and done.votes == 1 and done.memory == {}
    assert sync.collect() is None
    quiet = sync.now(boundary(2, 1.0, log=False))
    assert quiet.loss == 0.0 and quiet.votes == 0  # a step that logs nothing sends no loss


def test_stop_at_step_needs_no_agreement():
    flag = StopFlag(signals=(), stop_at_step=4)
    assert not flag.vote() and not flag.reached(3)
    assert flag.reached(4) and flag.reason == f"{jobenv.STOP_AT_STEP}=4"


WORKER = """
import os, signal, sys
import torch
from train_entry.dist import exit_now, init_distributed
from train_entry.preempt import StopFlag
from train_entry.stepsync import Boundary, StepSync

info = init_distributed()
stop = StopFlag(signals=("USR2",)).install()
sync = StepSync(info.device, rank=info.rank, world_size=info.world_size)
lines, step = [], 0
while True:
    step += 1
    if info.rank == 1 and step == 3:
        os.kill(os.getpid(), signal.SIGUSR2)  # only rank 1 is told, during step 3
    here = Boundary(step=step, loss_sum=torch.tensor(float(info.rank + 1)), grad_norm=0.0,
                    lr=0.0, vote=stop.vote(), log=True)
    before = sync.collect()
    if before is not None:
        lines.append(f"{before.step}:{before.loss:g}:{before.votes}")
    if before is not None and before.votes:
        stop.raise_("another rank")
        lines.append(f"{sync.now(here).step}:last")
        break
    sync.launch(here)
open(os.path.join(sys.argv[1], f"rank-{info.rank}"), "w").write(f"{step} {stop.reason} {lines}")
exit_now(0)
"""


@pytest.mark.slow
def test_a_vote_on_one_rank_stops_every_rank_at_the_same_next_step(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(tmp_path / "worker.py"),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # losses 1 + 2 summed over ranks; rank 1's vote of step 3 is read by both at the end of step 4
    seen = "['1:3:0', '2:3:0', '3:3:1', '4:last']"
    assert (tmp_path / "rank-1").read_text() == f"4 SIGUSR2 {seen}"
    assert (tmp_path / "rank-0").read_text() == f"4 another rank {seen}"


def test_cpu_runs_keep_freed_memory_in_the_heap(monkeypatch):
    """train_entry.dist.keep_freed_memory: glibc's mallopt applied on Linux, left to the user's
    own MALLOC_MMAP_THRESHOLD_ when set."""
    from train_entry.dist import keep_freed_memory

    assert keep_freed_memory() is sys.platform.startswith("linux")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    assert keep_freed_memory() is False


@pytest.mark.slow
def test_a_stop_at_the_last_step_finds_the_training_complete(tmp_path):
    """A stop asked at the last step (a time-limit warning that comes just then) ends the run as
    done, exit 0 with the final parameters' hash, not as preempted (75) for a restart to finish."""
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "train_entry", "--run-dir", str(run), "--max-steps", "3"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1", jobenv.STOP_AT_STEP: "3"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert len((run / "final_params.sha256").read_text().strip()) == 64
    assert "stopped at step" not in (run / "train.log").read_text()
