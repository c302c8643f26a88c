"""The preemption chain and `hpctrain resume` end to end, with the local executor, real torchrun and
gloo (2 ranks): `hpctrain preempt` at a random step -> save, exit 75, requeue in the script -> resume
-> bit-identical; SIGKILL of the whole job at random moments (during saves too), 10 times, each
followed by `hpctrain resume` -> bit-identical; resume refuses what it must."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _demo import STEPS, demo_run
from _events import flow
from _preempted import NAME, SEED, last_step, preempted_run

from hpctrain import dispatch
from hpctrain.kernel import jobenv
from hpctrain.runs.folder import RunDir
from train_entry.checkpoint import newest_verified, verify

pytestmark = pytest.mark.slow


TRAIN = ["--max-steps", str(STEPS)]  # 60: room for a signal or 10 kills to land before the end


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    """final_params.sha256 of one uninterrupted run: the demo's ddp run of as many steps
    (tests/_demo.py, shared with other files; neither the checkpoint cadence nor the local
    profile's launch changes it)."""
    return final_hash(demo_run(tmp_path_factory, "ddp"))


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """Run `hpctrain ...` in tmp_path with its own config and run index."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for key in (jobenv.STOP_AT_STEP, jobenv.STOP_FILE, jobenv.RUN_DIR):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)

    def run(*args: str, ok: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [sys.executable, "-m", "hpctrain", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if ok:
            assert out.returncode == 0, f"hpctrain {' '.join(args)}:\n{out.stdout}\n{out.stderr}"
        return out

    return run


def wait_until(cond, timeout: float = 180, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what} (seed {SEED})"
        time.sleep(0.005)


def job_processes(run: Path) -> list[int]:
    """Processes of this run: the script, torchrun and the workers (they carry the run folder)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            if str(run) in cmd and stat.rsplit(")", 1)[-1].split()[0] != "Z":
                pids.append(int(proc.name))
    return pids


def sigkill_job(run: Path) -> None:
    """What a node loss looks like: every process of the job dies at once, no handler runs."""
    state = json.loads((run / "state.json").read_text())
    for pid in job_processes(run):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(int(state["pgid"]), signal.SIGKILL)
    except (ProcessLookupError, TypeError, ValueError):
        pass
    wait_until(lambda: not job_processes(run), 30, "the killed job to be gone")


def final_hash(run: Path) -> str:
    return (run / "final_params.sha256").read_text().strip()


def test_preempt_requeue_resume_is_bit_identical(tmp_path_factory, reference):
    """The run: tests/_preempted.py (shared with test_in_job_restart)."""
    pre = preempted_run(tmp_path_factory)
    run, at = pre.run, pre.at
    assert "SIGUSR2" in pre.said
    assert pre.final == "COMPLETED", (run / "logs" / "batch.log").read_text()[-3000:]

    events = flow([json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()])
    names = [e["event"] for e in events]
    assert names == ["signal", "preempted", "requeue", "done"], names
    stopped = next(e["step"] for e in events if e["event"] == "preempted")
    assert at <= stopped < 60
    restarts = [json.loads(line) for line in (run / "restarts.jsonl").read_text().splitlines()]
    assert [r["restart_count"] for r in restarts] == [0, 1]
    assert (
        f"resumed from {run / 'checkpoints' / f'step-{stopped:08d}'} "
        in (run / "train.log").read_text()
    )
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    after = steps[steps.index(stopped) + 1 :]
    assert after[0] == stopped + 1, "steps were redone after a signal preemption"
    assert final_hash(run) == reference, f"seed {pre.seed}, preempted at {stopped}"
    status = json.loads(pre.hp("status", NAME, "--json").stdout)
    assert status["restarts"] == 1 and len(status["history"]) == 2


def test_sigkill_at_random_moments_then_resume_is_bit_identical(cli, tmp_path, reference):
    train = [*TRAIN, "--checkpoint-every", "2"]
    cli(
        "submit",
        "--profile",
        "local",
        "--nodes",
        "1",
        "--gpus",
        "2",
        "--name",
        "kill",
        "--",
        *train,
    )
    run = tmp_path / "runs" / "kill"
    ckpts = run / "checkpoints"
    rng = random.Random(SEED)
    resumed_from: list[str] = []
    during_save = 0  # kills that found a save in progress (its staging folder) just before
    for trial in range(10):
        start = last_step(run)
        if trial % 2:  # kill inside a save: as soon as a staging folder appears
            wait_until(
                lambda start=start: last_step(run) > start and any(ckpts.glob(".staging-*")),
                what="a save in progress",
            )
        else:  # kill at a random step, anywhere inside it
            target = start + 1 + rng.randint(0, 2)
            wait_until(lambda target=target: last_step(run) >= target, what=f"step {target}")
            time.sleep(rng.uniform(0, 0.05))
        during_save += bool(any(ckpts.glob(".staging-*")))
        sigkill_job(run)
        assert dispatch.state(RunDir(run)) == "LOST"
        assert not (run / "final_params.sha256").exists(), f"trial {trial}: the run finished first"
        newest = newest_verified(ckpts)
        for folder in ckpts.glob("step-*"):
            assert verify(folder)[1] is None, (
                f"trial {trial}: {folder} does not verify after SIGKILL"
            )
        out = cli("resume", "kill")
        expect = f"from {newest[0].name} (verified)" if newest else "from the start"
        assert expect in out.stdout, out.stdout
        resumed_from.append(newest[0].name if newest else "start")
        if newest:
            wait_until(
                lambda newest=newest: (
                    f"resumed from {newest[0]} " in (run / "train.log").read_text()
                ),
                what=f"trial {trial}: resume from {newest[0].name}",
            )
    assert during_save >= 4, f"only {during_save} of 10 kills landed inside a save"
    assert dispatch.wait(RunDir(run), poll_s=0.5) == "COMPLETED"
    assert final_hash(run) == reference, f"seed {SEED}: {resumed_from}"
    jobs = [json.loads(line)["kind"] for line in (run / "jobs.jsonl").read_text().splitlines()]
    assert jobs == ["submit"] + ["resume"] * 10


def test_resume_and_preempt_refuse_what_they_must(cli, tmp_path):
    cli(
        "submit",
        "--profile",
        "local",
        "--nodes",
        "1",
        "--gpus",
        "1",
        "--name",
        "one",
        "--wait",
        "--",
        "--max-steps",
        "2",
    )
    out = cli("resume", "one", ok=False)
    assert out.returncode == 2 and "COMPLETED" in out.stderr and "--max-steps" in out.stderr
    assert "Traceback" not in out.stderr
    out = cli("preempt", "one", ok=False)
    assert out.returncode == 2 and "not RUNNING" in out.stderr and "Traceback" not in out.stderr
    out = cli("resume", "one", "--max-steps", "1", ok=False)
    assert out.returncode == 2 and "N > 2" in out.stderr
    cli("resume", "one", "--max-steps", "4", "--wait")
    run = tmp_path / "runs" / "one"
    assert "resumed from" in (run / "train.log").read_text()
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4
    assert list(run.glob("job.sh.before-resume-*"))

    cli(
        "submit",
        "--profile",
        "local",
        "--nodes",
        "1",
        "--gpus",
        "1",
        "--name",
        "busy",
        "--",
        "--max-steps",
        "100000",
    )
    wait_until(
        lambda: dispatch.state(RunDir(tmp_path / "runs" / "busy")) == "RUNNING", 60, "RUNNING"
    )
    out = cli("resume", "busy", ok=False)
    assert out.returncode == 2 and "RUNNING" in out.stderr and "hpctrain cancel busy" in out.stderr
    cli("cancel", "busy")
    # (a DeepSpeed run resumes at another --nodes too: its universal checkpoint, test_resize.py)
