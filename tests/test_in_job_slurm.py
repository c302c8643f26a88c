"""In-job restart under `launch.launcher: srun` on the loopback Slurm cluster (issue 24): SIGKILL of
one rank ends the srun step (--kill-on-bad-exit), the batch shell starts a new one from the newest
in-memory snapshot; same job id, no requeue, bit-identical. Its own file so that the local live tests
of tests/test_in_job_restart.py are not held to the cluster's worker (tests/conftest.py)."""

from __future__ import annotations

import os
import signal

import pytest
from test_in_job_restart import GPUS, NODES, STEPS, TRAIN, Job, lines, reference_of

from hpctrain.kernel import layout


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    return reference_of(tmp_path_factory, "ddp")


@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_a_killed_rank_restarts_in_the_job_under_launcher_srun(slurm_cluster, tmp_path, reference):
    """launcher srun on Slurm: the killed task ends the step (--kill-on-bad-exit), the batch shell
    starts a new one from the snapshot (every 4 steps); same job id, no requeue, bit-identical."""
    from test_parallel_slurm import frozen, ranks
    from test_slurm_e2e import ENDED, Runs

    runs = Runs(tmp_path)
    job_id = runs.submit(
        "srun",
        "--set",
        "launch.launcher=srun",
        nodes=NODES,
        gpus=GPUS,
        # no disk checkpoint near the kill: at or just past one the disk copy would load instead
        train=[*TRAIN, "--snapshot.every_steps=4", f"--checkpoint-every={STEPS}"],
    )
    run = runs.run("srun")
    runs.until("training past step 25", lambda: Job.steps_of(run) >= 25, 600, poll=0.02)
    pids = ranks(run)
    assert len(pids) == NODES * GPUS, pids
    with frozen(pids[:-1]):
        os.kill(pids[-1], signal.SIGSTOP)
        reached = Job.steps_of(run)
        assert reached < STEPS, "the run finished before the kill"
        os.kill(pids[-1], signal.SIGKILL)
    info = runs.wait("srun", ENDED, 600)
    assert info["state"] == "COMPLETED" and str(info["job_id"]) == job_id, info
    assert (run / layout.FINAL_PARAMS).read_text() == reference
    assert [s["restart_count"] for s in lines(run / layout.RESTARTS)] == [0]
    events = lines(run / layout.EVENTS)
    assert [e["restart"] for e in events if e["event"] == "in_job_restart"] == [1], events
    assert not [e for e in events if e["event"] == "requeue"], events
    assert info["in_job_restarts"]["count"] == 1, info
    (ev,) = [e for e in events if e["event"] == "in_job_restart"]
    assert ev["steps_redone"] <= 2 * 4, ev  # the killed rank may have died inside the last one
    log = (run / "train.log").read_text()
    assert f"resumed from the in-memory snapshot of step {ev['resumed_step']}" in log, log[-2000:]
