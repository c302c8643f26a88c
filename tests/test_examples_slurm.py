"""The three examples (plain DDP, Accelerate, Lightning with its one line `HpctrainCheckpoint`, all
under torchrun) on the live 2-node cluster, through `hpctrain preempt` -> save -> exit 75 -> requeue
-> resume, each ending bit-identical to an uninterrupted run; and an unchanged Accelerate script
seeing the whole job, locally and on Slurm.

    sudo .venv/bin/python -m pytest -m slurm tests/test_examples_slurm.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _events import kinds
from _hold import held
from test_slurm_e2e import ENDED, lines, steps
from test_slurm_e2e import runs as runs  # the fixture: one Runs per test, nothing left queued

from hpctrain.kernel import jobenv

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = {
    "ddp": "ddp_torch.py",
    "accelerate": "accelerate_train.py",
    "lightning": "lightning_train.py",
}
STEPS = 30
# --sleep: each step takes long enough that the preemption lands mid-run (tiny models, 2 cores)
ARGS = ["--steps", str(STEPS), "--save-every", "10", "--sleep", "0.2"]
PLAIN_ACCELERATE = REPO / "tests" / "scripts" / "plain_accelerate.py"


def _reference(name: str, folder: Path) -> subprocess.Popen:
    """The uninterrupted run: plain torchrun, 2 processes on this machine (world 2, as the jobs)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    for key in (jobenv.RUN_DIR, jobenv.STOP_FILE):
        env.pop(key, None)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(REPO / "examples" / EXAMPLES[name]),
            "--run-dir",
            str(folder),
            "--steps",
            str(STEPS),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_examples_preempt_requeue_resume_bit_identical(runs):
    refs = {name: _reference(name, runs.root / "ref" / name) for name in EXAMPLES}
    try:
        for name, script in EXAMPLES.items():
            runs.submit(name, "--script", str(REPO / "examples" / script), gpus=1, train=ARGS)
        preempted: set[str] = set()
        # 3 jobs of 2 x 1 on 2 nodes x 2 GPUs: the third waits for a free GPU per node
        deadline = time.monotonic() + 360
        while preempted != set(EXAMPLES):  # preempt each once it is past step 3
            assert time.monotonic() < deadline, f"only {preempted} got past step 3"
            for name in EXAMPLES:
                if name not in preempted and len(steps(runs.run(name))) >= 3:
                    with held(runs.run(name)):  # lands mid-run however slow it is
                        runs.hp("preempt", name)
                    preempted.add(name)
            time.sleep(0.5)
        for name, proc in refs.items():
            out = proc.communicate(timeout=240)[0]
            assert proc.returncode == 0, f"reference {name}:\n{out[-3000:]}"
    finally:
        for proc in refs.values():
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    for name in EXAMPLES:
        run = runs.run(name)
        info = runs.wait(name, ENDED, 300)
        assert info["state"] == "COMPLETED", (name, info)
        ref = (runs.root / "ref" / name / "final_params.sha256").read_text()
        assert (run / "final_params.sha256").read_text() == ref, name
        names = kinds(lines(run / "events.jsonl"))
        assert names[:3] == ["signal", "preempted", "requeue"] and names[-1] == "done", (
            name,
            names,
        )
        stopped = lines(run / "events.jsonl")[1]["step"]
        assert 3 <= stopped < STEPS, (name, stopped)
        assert [h["restart_count"] for h in info["history"]][:2] == [0, 1], (name, info)
        # the second start resumed from the preemption's checkpoint and did not redo a step
        logs = runs.hp("logs", name).stdout
        if name == "lightning":  # Lightning's own checkpoint (HpctrainCheckpoint: last.ckpt)
            resumed = f"resuming from {run}/checkpoints/last.ckpt (step {stopped})"
        else:  # runtime.Checkpoint's, which `status` reads
            assert info["checkpoint_step"] == STEPS
            resumed = f"resuming from {run}/checkpoints/step-{stopped:08d}"
        assert resumed in logs, (name, logs[-3000:])
        assert steps(run) == list(range(1, STEPS + 1)), (name, steps(run))
    # what the preempted run cost, from sacct: every attempt's GPUs x elapsed
    rep = json.loads(runs.hp("report", "ddp", "--json").stdout)
    s = rep["runs"][0]
    assert s["restarts"] == 1 and s["steps_redone"] == 0 and s["steps"] == STEPS, s
    assert s["gpu_hours_source"] == "sacct" and s["gpu_hours"] > 0, s
    assert s["saves"] >= 3 and s["newest_checkpoint"]["step"] == STEPS, s
    assert (runs.run("ddp") / "report" / "loss.png").is_file()


def _accelerate_world(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("rank-*.json"))]


@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_unchanged_accelerate_script_sees_the_whole_job_on_slurm(runs):
    out = runs.root / "acc-out"
    runs.submit("plain-acc", "--script", str(PLAIN_ACCELERATE), gpus=1, train=[str(out)])
    assert runs.wait("plain-acc", ENDED, 240)["state"] == "COMPLETED"
    seen = _accelerate_world(out)
    assert [s["num_processes"] for s in seen] == [2, 2], seen
    assert all(s["gathered"] == [0, 1] and "MULTI_CPU" in s["distributed_type"] for s in seen)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_unchanged_accelerate_script_sees_the_whole_job_locally(tmp_path):
    out = tmp_path / "acc-out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ACCELERATE_USE_CPU", None)  # the node environment must set it, not the caller
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "submit",
            "--profile",
            "local",
            "--nodes",
            "2",
            "--gpus",
            "1",
            "--name",
            "plain-acc",
            "--script",
            str(PLAIN_ACCELERATE),
            "--wait",
            "--",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    seen = _accelerate_world(out)
    assert [s["num_processes"] for s in seen] == [2, 2], seen
    assert all(s["gathered"] == [0, 1] for s in seen), seen
