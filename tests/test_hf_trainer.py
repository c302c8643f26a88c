"""Hugging Face Trainer on the live 2 nodes x 2 workers cluster (examples/hf_trainer.py: a tiny GPT-2
from a config, a synthetic dataset), as a Trainer user runs it:

- unchanged (`--plain`): `hpctrain preempt` mid-run; Trainer never sees the stop, trains to its end
  and the run ends COMPLETED with exactly one start; `--wait` shows step/total and loss read from
  Trainer's own files;
- with `callbacks=[HpctrainCallback()]`: preempt -> checkpoint-<step> at that step -> exit 75 ->
  requeue -> resume from it (no step redone); later SIGKILL of every rank, `hpctrain resume` ->
  Trainer resumes from its newest checkpoint -> COMPLETED, final weights bit-identical to the
  unchanged run's (Trainer's resume is exact on CPU: model, optimizer, scheduler, every rank's RNG,
  the data position).

    sudo .venv/bin/python -m pytest -m slurm tests/test_hf_trainer.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from _events import kinds
from test_slurm_e2e import HPCTRAIN, Runs, lines

from hpctrain.jobs.request import USER_ENTRY
from hpctrain.runs.progress import snapshot

pytestmark = [pytest.mark.slurm]

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "examples" / "hf_trainer.py"
# 60 steps (80 before): the preemption lands near step 11 (live, load 6), and the test needs a save
# of Trainer's between it and the end (k < STEPS - SAVE) to SIGKILL after; the steps themselves are
# a small part of the test (4 job starts of 4 ranks importing torch and transformers, ~25 s each).
STEPS, SAVE = 60, 20


@pytest.fixture
def runs(slurm_cluster, tmp_path, request):
    r = Runs(tmp_path)
    yield r
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        r.dump()
        for log in sorted((tmp_path / "runs").glob("*/logs/torchrun/node-0/*/attempt_*/0/*.log")):
            print(f"==> {log} <==\n{log.read_text(errors='replace')[-4000:]}")
    for jobs in (tmp_path / "runs").glob("*/jobs.jsonl"):
        for job in lines(jobs):
            subprocess.run(["scancel", str(job["job_id"])], capture_output=True, timeout=30)


def _submit(runs: Runs, name: str, *extra: str, wait: bool) -> subprocess.Popen | None:
    argv = [
        *HPCTRAIN,
        "submit",
        "--profile",
        "loopback",
        "--nodes",
        "2",
        "--gpus",
        "2",
        "--name",
        name,
        "--set",  # the SIGKILL below tests a failed job, not an in-job restart
        "preemption.max_in_job_restarts=0",
        "--script",
        str(SCRIPT),
        *(["--wait"] if wait else []),
        "--",
        str(runs.root / "out" / name),
        "--steps",
        str(STEPS),
        "--save-steps",
        str(SAVE),
        "--sleep",
        "0.1",
        *extra,
    ]
    if not wait:
        subprocess.run(argv, cwd=runs.root, env=runs.env, check=True, capture_output=True)
        return None
    return subprocess.Popen(
        argv,
        cwd=runs.root,
        env=runs.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _step(run: Path) -> int:
    snap = snapshot(run)
    return snap.step if snap else 0


def _final(runs: Runs, name: str) -> str:
    return (runs.root / "out" / name / "final_params.sha256").read_text()


def _saves(out: Path) -> list[int]:
    return sorted(
        int(p.parent.name.split("-")[1]) for p in out.glob("checkpoint-*/trainer_state.json")
    )


# Measured at load 19 on the 2-core machine: a 2 x 2 start (4 processes importing torch and
# transformers) up to step 1 took 90-105 s, 80 steps ~30 s; idle, ~20 s and ~25 s; at load 6,
# 24-27 s and ~15 s.
START_S = 330


@pytest.mark.timeout(1500)
def test_trainer_unchanged_and_with_the_callback_through_preemption_and_sigkill(runs):
    plain = _submit(runs, "plain", "--plain", wait=True)
    runs.until("plain submitted", lambda: lines(runs.run("plain") / "jobs.jsonl"), 60)
    cb = _submit(runs, "cb", wait=True)  # queued behind plain: each takes 2 nodes x 2
    out = runs.root / "out" / "cb"
    try:
        for name in ("plain", "cb"):  # preempt each mid-run, past step 5
            runs.until(f"{name} past step 5", lambda n=name: _step(runs.run(n)) >= 5, START_S * 2)
            runs.hp("preempt", name)
        waited = {"plain": plain.communicate(timeout=START_S)[0]}
        # cb: requeued and resumed; SIGKILL every rank once it is 2 steps past a later save
        runs.until(
            "cb restarted",
            lambda: len(lines(runs.run("cb") / "restarts.jsonl")) == 2,
            START_S,
        )
        k = next(e["step"] for e in lines(runs.run("cb") / "events.jsonl") if "step" in e)
        assert k < STEPS - SAVE, f"preempted at step {k}: no save of Trainer's left before the end"
        runs.until("cb saved after its resume", lambda: _saves(out)[-1] > k, START_S)
        newest = _saves(out)[-1]
        runs.until("cb 2 steps past it", lambda: _step(runs.run("cb")) >= newest + 2, START_S)
        assert _kill_ranks(out), "no rank process found"
        waited["cb"] = cb.communicate(timeout=120)[0]
    finally:
        for proc in (plain, cb):
            if proc.poll() is None:
                proc.kill()
    assert f"plain: COMPLETED  step {STEPS}/{STEPS}  loss " in waited["plain"], waited["plain"]
    assert "cb: FAILED  step " in waited["cb"] and "  loss " in waited["cb"], waited["cb"]

    # unchanged: the stop is recorded, the script trains on to its end, one start, nothing requeued
    run = runs.run("plain")
    events = kinds(lines(run / "events.jsonl"))
    assert events == ["signal", "done"], events
    assert len(lines(run / "restarts.jsonl")) == 1
    assert "(from " in waited["plain"], waited["plain"]  # trainer_state.json or its log lines

    # with the callback: checkpoint-<k> at the stop, exit 75, requeue, resume from it
    run = runs.run("cb")
    events = lines(run / "events.jsonl")
    assert [e["event"] for e in events][:4] == ["signal", "preempted", "requeue", "failed"], events
    assert 5 <= k < STEPS and k in _saves(out), (k, _saves(out))
    logs = runs.hp("logs", "cb").stdout
    assert f"resuming from {out}/checkpoint-{k}" in logs, logs[-3000:]
    rep = json.loads(runs.hp("report", "cb", "--json").stdout)["runs"][0]
    assert rep["restart_details"][0]["steps_redone"] == 0, rep  # the preemption redid no step

    # after the SIGKILL, `hpctrain resume`: Trainer resumes from its newest checkpoint
    resumed = runs.hp("resume", "cb", "--wait", timeout=START_S * 2)
    assert f"cb: COMPLETED  step {STEPS}/{STEPS}  loss " in resumed.stdout + resumed.stderr
    logs = runs.hp("logs", "cb").stdout
    assert f"resuming from {out}/checkpoint-{newest}" in logs, logs[-3000:]
    assert [s["restart_count"] for s in lines(run / "restarts.jsonl")][:2] == [0, 1]
    # both interruptions, and the final weights are the uninterrupted (unchanged) run's, bit for bit
    assert _final(runs, "cb") == _final(runs, "plain")


def _kill_ranks(out: Path) -> list[int]:
    """SIGKILL every training process of the run whose output folder is `out` (all 4 ranks)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # a rank: python -u -m hpctrain.launchers.entry SCRIPT OUT ... (not torchrun, srun, bash
        # or `hpctrain submit --wait`, whose argv name the script and folder too)
        python = Path(argv[0].decode()).name.startswith("python")
        rank = python and argv[1:4] == [b"-u", b"-m", USER_ENTRY.encode()]
        if rank and str(SCRIPT).encode() in argv and str(out).encode() in argv:
            pids.append(int(proc.name))
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    time.sleep(0.1)
    return pids
