"""The 2D layouts, FSDP2 x TP (dp 2 x tp 2) and FSDP2 x PP (pp 2 x dp 2, 1F1B), live on the
loopback Slurm cluster (2 nodes x 2, the shipped `loopback` profile): `hpctrain preempt` -> save,
exit 75, Slurm requeue -> resume, then SIGKILL of every training process (srun, torchrun and
the ranks: no handler runs; the batch shell records the failure) -> `hpctrain resume`, ending
bit-identical to the same layout trained uninterrupted (the reference runs of
tests/test_parallel_layouts.py, shared across the xdist workers).

(`scancel --signal=KILL --full` is no hard kill here: on Slurm 22.05 the batch shell's trap sees
TERM and the ranks save before the job ends CANCELLED.)"""

from __future__ import annotations

import contextlib
import os
import signal

import pytest
from _events import kinds
from _hold import frozen, ranks
from test_parallel_layouts import BASE, LAYOUTS, final_hash, reference_run
from test_preempt_cli import job_processes
from test_slurm_e2e import ENDED, lines, steps
from test_slurm_e2e import runs as runs  # the fixture: one Runs per test, nothing left queued

pytestmark = [pytest.mark.slurm]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("layout", ["tp", "pp"])
def test_2d_layout_survives_preempt_and_sigkill_on_slurm(runs, tmp_path_factory, layout):
    nodes, gpus, flags = LAYOUTS[layout]
    reference = reference_run(tmp_path_factory, layout)
    run = runs.run("run")
    runs.submit("run", nodes=nodes, gpus=gpus, train=[*BASE, *flags, "--checkpoint-every", "2"])
    # Each moment that matters is held still with SIGSTOP, so the kill never races the last steps
    # (CI once saw the requeued half end its 6 steps before a 0.5 s poll noticed them).
    runs.until("training past step 3", lambda: len(steps(run)) >= 3, 600, poll=0.05)
    with frozen(ranks(run)):
        runs.hp("preempt", "run")  # the STOP file is there when the ranks go on
    runs.until(
        "the requeued job starts",
        lambda: any(x["restart_count"] == 1 for x in lines(run / "restarts.jsonl")),
        300,
    )
    stopped = next(e["step"] for e in lines(run / "events.jsonl") if e["event"] == "preempted")
    assert stopped <= 6, f"the stop landed at step {stopped}, not at the next step boundary"
    runs.until("training after the requeue", lambda: max(steps(run)) > stopped, 600, poll=0.05)
    for pid in ranks(run):
        os.kill(pid, signal.SIGSTOP)
    assert max(steps(run)) < 20, "the run finished before the kill"
    killed = job_processes(run)  # srun, torchrun and the ranks carry the run folder in argv
    for pid in killed:
        # a stopped process dies too, running no handler; one may be gone already (CI under two
        # hogs: srun's end took a rank with it before its own kill)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert len(killed) >= 4, killed
    info = runs.wait("run", ENDED, 300)
    assert info["state"] == "FAILED", info
    assert "(verified)" in runs.hp("resume", "run").stdout
    info = runs.wait("run", ENDED, 600)
    assert info["state"] == "COMPLETED", info
    assert final_hash(run) == final_hash(reference)
    names = kinds(lines(run / "events.jsonl"))
    assert names[:3] == ["signal", "preempted", "requeue"] and names[-1] == "done", names
    assert "mesh " in runs.hp("status", "run").stdout
