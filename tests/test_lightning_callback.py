"""Lightning with one line (hpctrain.integrations.lightning.HpctrainCheckpoint): a stop request ->
last.ckpt at that step -> exit 75 -> the next start's `fit(ckpt_path="last")` resumes there -> the
final weights equal an uninterrupted run's, bit for bit (CPU, 2 ranks as torchrun starts them, a run folder
and stop file as a job has them). examples/lightning_train.py as is: Lightning's DistributedSampler
over a shuffled loader, dropout, the stop in the second epoch (16 steps an epoch), so both the data
position and every rank's RNG must come back. Local ranks (torchrun's environment), no Slurm: the batch shell's part
(requeue on 75) has its own tests; the live run of this example is tests/test_examples_slurm.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.kernel import jobenv

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
STEPS, STOP_AT = 40, 22  # 256 samples / (2 ranks x 8) = 16 steps an epoch: the stop is in epoch 2


def _ranks(script: Path, run: Path, *extra: str, job: bool) -> list[subprocess.Popen]:
    """2 ranks with the environment torchrun gives its workers (TorchElasticEnvironment reads it),
    started directly: torchrun's agent would cost a torch import per launch, and each rank's own
    exit code is what a launcher sees."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    env |= {"MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    env |= {"GROUP_RANK": "0", "TORCHELASTIC_RUN_ID": "test"}
    for key in (jobenv.RUN_DIR, jobenv.STOP_FILE):
        env.pop(key, None)
    if job:  # what the batch script exports: the run folder and the stop file
        env |= {jobenv.RUN_DIR: str(run), jobenv.STOP_FILE: str(run / "STOP")}
    argv = [sys.executable, str(script), "--steps", str(STEPS), *extra]
    if not job:
        argv += ["--run-dir", str(run)]
    return [
        subprocess.Popen(
            argv,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            cwd=run.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ended(procs: list[subprocess.Popen]) -> tuple[list[int], str]:
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [p.returncode for p in procs], "\n".join(outs)


@pytest.mark.timeout(600)
def test_stop_saves_last_ckpt_exits_75_and_resumes_bit_identical(tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    script = REPO / "tests" / "scripts" / "lightning_stop_at.py"
    # the uninterrupted run (plain torchrun, no job environment) beside the first start
    procs = [
        _ranks(REPO / "examples" / "lightning_train.py", ref, job=False),
        _ranks(script, run, "--stop-at", str(STOP_AT), job=True),
    ]
    try:
        (rc_ref, out_ref), (rc_a, out_a) = (_ended(p) for p in procs)
    finally:
        for p in procs[0] + procs[1]:
            if p.poll() is None:
                p.kill()
    assert rc_ref == [0, 0], out_ref[-3000:]
    # the first start: stop file at the end of step 22 -> the vote (read one step later) agrees
    # at 23 on both ranks -> last.ckpt, every rank exits 75
    assert rc_a == [75, 75], out_a[-3000:]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["step"]) for e in events] == [("preempted", STOP_AT + 1)], events
    assert (run / "checkpoints" / "last.ckpt").is_file()

    (run / "STOP").unlink()  # the batch shell clears it before the requeued start
    rc_b, out_b = _ended(_ranks(script, run, job=True))
    assert rc_b == [0, 0], out_b[-3000:]
    assert f"resuming from {run}/checkpoints/last.ckpt (step {STOP_AT + 1})" in out_b, out_b
    assert "dataloader is not resumable" not in out_b  # the callback restores its position
    # exact: the same batches and dropout masks as the uninterrupted run
    assert (run / "final_params.sha256").read_text() == (ref / "final_params.sha256").read_text()
    # a metrics line per step (every_s=0 in the example), none redone
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1)), steps
