"""A 2D layout (FSDP2 x TP) live on the loopback Slurm cluster (2 nodes x 2, the shipped
`loopback` profile): `hpctrain preempt` -> save, exit 75, Slurm requeue -> resume, then
`scancel --signal=KILL --full` -> `hpctrain resume`, and end bit-identical to the
same layout trained uninterrupted (torchrun, 4 ranks).

Measured: on the test cluster (Slurm 22.05) the batch shell's trap sees TERM from that scancel and
the ranks save before the job ends CANCELLED, so this is a cancel + resume, not a hard kill; a true
SIGKILL of every process + `hpctrain resume` is covered on the local profile
(tests/test_parallel_layouts.py)."""

from __future__ import annotations

import subprocess

import pytest
from test_parallel_layouts import BASE, LAYOUTS, _torchrun, final_hash
from test_slurm_e2e import ENDED, Runs, lines, steps

pytestmark = [pytest.mark.slurm]


@pytest.fixture
def runs(slurm_cluster, tmp_path, request):
    r = Runs(tmp_path)
    yield r
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        r.dump()
    for jobs in (tmp_path / "runs").glob("*/jobs.jsonl"):
        for job in lines(jobs):
            subprocess.run(["scancel", str(job["job_id"])], capture_output=True, timeout=30)


@pytest.mark.timeout(1500)
# tp only: pp ran through preempt -> requeue -> resume -> cancel -> resume here but its last
# job waited behind other sessions' jobs past the timeout; the local tests cover pp end to end
@pytest.mark.parametrize("layout", ["tp"])
def test_2d_layout_survives_preempt_and_sigkill_on_slurm(runs, tmp_path, layout):
    nodes, gpus, flags = LAYOUTS[layout]
    train = [*BASE, *flags, "--checkpoint-every", "2"]
    _torchrun(tmp_path / "reference", nodes * gpus, *train)
    run = runs.run("run")
    job = runs.submit("run", nodes=nodes, gpus=gpus, train=train)
    runs.until("training past step 3", lambda: len(steps(run)) >= 3, 600)
    runs.hp("preempt", "run")
    runs.until(
        "the requeued job starts",
        lambda: any(x["restart_count"] == 1 for x in lines(run / "restarts.jsonl")),
        300,
    )
    stopped = next(e["step"] for e in lines(run / "events.jsonl") if e["event"] == "preempted")
    runs.until("training after the requeue", lambda: max(steps(run)) >= stopped + 3, 600)
    assert max(steps(run)) < 20, "the run finished before the kill"
    subprocess.run(["scancel", "--signal=KILL", "--full", job], check=True, timeout=30)
    runs.wait("run", ENDED, 300)
    assert "(verified)" in runs.hp("resume", "run").stdout
    info = runs.wait("run", ENDED, 900)
    assert info["state"] == "COMPLETED", info
    assert final_hash(run) == final_hash(tmp_path / "reference")
    kinds = [e["event"] for e in lines(run / "events.jsonl")]
    assert kinds[:3] == ["signal", "preempted", "requeue"] and kinds[-1] == "done", kinds
    assert "mesh " in runs.hp("status", "run").stdout
