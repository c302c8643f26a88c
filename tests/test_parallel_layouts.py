"""Tensor and pipeline parallel end to end on the local profile (real torchrun, gloo, CPU): each
layout trains the demo GPT like plain FSDP at the same global batch, survives `hpctrain preempt`
-> requeue -> resume and SIGKILL + `hpctrain resume` bit-identical, and a (dp 2, tp 2) checkpoint
loads on other meshes.

Tolerance (stated in docs/parallel.md): per-step loss within LOSS_TOL of the plain FSDP run. The
layouts compute the same sums in other orders (reduce-scatters over 2 instead of 4 ranks, the
vocabulary-parallel loss, microbatches), so the difference is float32 rounding: measured at most
4.8e-7 over the 20 steps for tp, pp and tp x pp (loss 2.903 -> 2.754); LOSS_TOL = 1e-4 leaves a
margin of 200x and is far below one step's loss change.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _events import kinds
from _hold import held
from filelock import FileLock
from test_preempt_cli import sigkill_job

from hpctrain import dispatch
from hpctrain.kernel import jobenv
from hpctrain.runs.folder import RunDir

# the reference fixture trains 4 layouts (about 4 min on an idle 2-core machine, 20 under load)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parent.parent
LOSS_TOL = 1e-4
STEPS = 20
BASE = ["--strategy", "fsdp", "--max-steps", str(STEPS)]
# name -> (nodes, workers per node, the layout's flags); the reference is plain FSDP at 2 x 2
LAYOUTS = {
    "fsdp": (2, 2, []),
    "tp": (2, 2, ["--parallel.tp", "2"]),  # FSDP2 x TP, dp 2 x tp 2
    "pp": (2, 2, ["--parallel.pp", "2"]),  # FSDP2 x PP (1F1B), pp 2 x dp 2
    "tp-pp": (2, 4, ["--parallel.tp", "2", "--parallel.pp", "2"]),  # pp 2 x dp 2 x tp 2
}


class Home:
    """A folder with its own hpctrain state and config; `hp(...)` runs the CLI there."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in (jobenv.STOP_AT_STEP, jobenv.STOP_FILE, jobenv.RUN_DIR)
        } | {
            "XDG_STATE_HOME": str(root / "state"),
            "XDG_CONFIG_HOME": str(root / "config"),
            "OMP_NUM_THREADS": "1",
        }

    def hp(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [sys.executable, "-m", "hpctrain", *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.root,
            timeout=timeout,
        )
        assert out.returncode == 0, f"hpctrain {' '.join(args)}:\n{out.stdout}\n{out.stderr}"
        return out

    def submit(self, name: str, layout: str, *extra: str, wait: bool = False) -> Path:
        nodes, gpus, flags = LAYOUTS[layout]
        self.hp(
            "submit",
            "--profile",
            "local",
            "--nodes",
            str(nodes),
            "--gpus",
            str(gpus),
            "--name",
            name,
            *(["--wait"] if wait else []),
            "--",
            *BASE,
            *flags,
            *extra,
        )
        return self.root / "runs" / name


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "step" in r}


def final_hash(run: Path) -> str:
    return (run / "final_params.sha256").read_text().strip()


def last_step(run: Path) -> int:
    try:
        return max(losses(run), default=0)
    except (OSError, ValueError):
        return 0


def wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def reference_run(tmp_path_factory: pytest.TempPathFactory, layout: str) -> Path:
    """`layout`'s uninterrupted run (checkpoints at 10 and 20), trained once per test session:
    under pytest-xdist its folder and lock are shared by the workers, so this file and the live
    tests (tests/test_parallel_slurm.py, on the other worker) never train it twice."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    home = Home(root / "layouts")
    home.root.mkdir(exist_ok=True)
    run = home.root / "runs" / f"ref-{layout}"
    with FileLock(home.root / f"ref-{layout}.lock"):
        if not (run / "final_params.sha256").is_file():
            shutil.rmtree(run, ignore_errors=True)  # a half-built one of an interrupted session
            home.submit(run.name, layout, "--checkpoint-every", "10", wait=True)
    return run


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, Path]:
    """Each layout's uninterrupted run, and plain FSDP's."""
    return {layout: reference_run(tmp_path_factory, layout) for layout in LAYOUTS}


@pytest.mark.parametrize("layout", ["tp", "pp", "tp-pp"])
def test_layout_trains_like_plain_fsdp(reference, layout):
    ref, run = losses(reference["fsdp"]), losses(reference[layout])
    assert sorted(run) == list(range(1, STEPS + 1))
    first, last = sum(run[s] for s in range(1, 6)) / 5, sum(run[s] for s in range(16, 21)) / 5
    assert last < first - 0.05, f"{layout}: the loss did not fall ({first:.3f} -> {last:.3f})"
    worst = max(abs(run[s] - ref[s]) for s in run)
    assert worst <= LOSS_TOL, f"{layout}: loss differs from plain fsdp by {worst:.2e}"
    log = (reference[layout] / "train.log").read_text()
    nodes, gpus, _ = LAYOUTS[layout]
    mesh = {"tp": "dp 2 x tp 2", "pp": "pp 2 x dp 2", "tp-pp": "pp 2 x dp 2 x tp 2"}[layout]
    assert f"{nodes * gpus} ranks on a mesh of {mesh}" in log, log[:2000]
    # status and report show the mesh (mesh.json, written by train_entry at each start)
    home = Home(reference[layout].parent.parent)
    name = reference[layout].name
    assert f"mesh {mesh}" in home.hp("status", name).stdout
    assert f"layout: {mesh} (fsdp" in home.hp("report", name, "--no-plots").stdout


# the 2D layouts do the same live on Slurm (tests/test_parallel_slurm.py)
@pytest.mark.parametrize("layout", ["tp-pp"])
def test_preempt_requeue_then_sigkill_resume_is_bit_identical(reference, tmp_path, layout):
    """`hpctrain preempt` mid-run (save, exit 75, requeue, resume), then SIGKILL of the whole
    job and `hpctrain resume`: the final parameters equal the uninterrupted run's, bit for bit."""
    home = Home(tmp_path)
    run = home.submit("run", layout, "--checkpoint-every", "2")
    wait_until(lambda: last_step(run) >= 3, 600, "step 3")
    with held(run):  # the preempt lands mid-run however slow it is under load
        home.hp("preempt", "run")
    restarts = run / "restarts.jsonl"
    wait_until(
        lambda: restarts.is_file() and len(restarts.read_text().splitlines()) >= 2,
        600,
        "the requeue",
    )
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    stopped = next(e["step"] for e in events if e["event"] == "preempted")
    wait_until(lambda: last_step(run) >= stopped + 3, 600, "training after the requeue")
    assert last_step(run) < STEPS, "the run finished before the kill; make it longer"
    sigkill_job(run)  # every process of the job at once, no handler runs
    wait_until(lambda: dispatch.state(RunDir(run)) == "LOST", 60, "the job to be lost")
    out = home.hp("resume", "run")
    assert "(verified)" in out.stdout, out.stdout
    assert dispatch.wait(RunDir(run), poll_s=0.5) == "COMPLETED", (run / "train.log").read_text()
    assert final_hash(run) == final_hash(reference[layout])
    names = kinds([json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()])
    assert names[:3] == ["signal", "preempted", "requeue"] and names[-1] == "done", names


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(jobenv.PREFIX)}
    return env | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), jobenv.DEVICE: "cpu"} | extra


def _launch(nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "-m",
        "train_entry",
    ]


def _torchrun(run: Path, nproc: int, *args: str) -> subprocess.CompletedProcess:
    cmd = [*_launch(nproc), "--run-dir", str(run), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=900)
    assert out.returncode == 0, f"{' '.join(cmd)}\n{out.stdout}\n{out.stderr[-4000:]}"
    return out


@pytest.mark.parametrize(
    ("name", "flags"), [("dp4", []), ("pp2-dp2", ["--parallel.pp", "2"])], ids=["dp4", "pp2xdp2"]
)
def test_a_dp2_tp2_checkpoint_resumes_on_another_mesh(reference, tmp_path, name, flags):
    """(dp 2, tp 2)'s step 10 loads as dp 4 (plain FSDP) and as (pp 2, dp 2); the loss of steps
    11-20 continues the (dp 2, tp 2) run's within LOSS_TOL."""
    src = reference["tp"] / "checkpoints" / "step-00000010"
    run = tmp_path / name
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(src, run / "checkpoints" / src.name)
    (run / "checkpoints" / "latest").write_text(src.name + "\n")
    out = _torchrun(run, 4, *BASE, *flags)
    assert "resumed from" in out.stdout and "step 10/20" in out.stdout, out.stdout
    ref, got = losses(reference["tp"]), losses(run)
    assert sorted(got) == list(range(11, STEPS + 1))
    worst = max(abs(got[s] - ref[s]) for s in got)
    assert worst <= LOSS_TOL, f"{name}: loss differs from the dp2 x tp2 run by {worst:.2e}"


def test_the_worked_example_plan_and_split_train_a_user_model(reference, tmp_path):
    """examples/gpt_parallel.py through the user keys (model.factory, parallel.tp_plan,
    parallel.pp_split) on tp 2 x pp 2: the same losses as the built-in demo plan's run."""
    ex = "examples.gpt_parallel"
    out = subprocess.run(
        [
            *_launch(4),
            "--run-dir",
            str(tmp_path / "user"),
            *BASE,
            f"--model.factory={ex}:model",
            "--parallel.tp=2",
            f"--parallel.tp_plan={ex}:tp_plan",
            "--parallel.pp=2",
            f"--parallel.pp_split={ex}:pp_split",
        ],
        capture_output=True,
        text=True,
        env=_env(**{jobenv.STOP_AT_STEP: "3"}),
        timeout=900,
    )
    assert "stopped at step 3" in out.stdout, out.stdout + out.stderr[-4000:]
    ref, got = losses(reference["tp-pp"]), losses(tmp_path / "user")
    assert sorted(got) == [1, 2, 3]
    assert max(abs(got[s] - ref[s]) for s in got) <= LOSS_TOL
