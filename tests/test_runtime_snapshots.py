"""Snapshots in memory for user scripts (issue 24 item 4): `runtime.Checkpoint.snapshot` and the
in-job restart of a script that follows the documented pattern (examples/ddp_torch.py).

The decision (one process, real files and torch): after an in-job restart `load()` returns the
newest snapshot when it is newer than the newest verified disk checkpoint, RNG restored, else the
disk; a first start, or a run outside a job, loads the disk. The exchange between ranks is the one
train_entry uses (hpctrain/runtime/recovery.py; tests/test_snapshots.py tests it across gloo ranks).

Live on the local profile (real torchrun, c10d, gloo; 2 simulated nodes x 1 rank): SIGKILL of one
rank of the example -> COMPLETED in the same job start, resumed from a snapshot, bit-identical to
an uninterrupted run of the same script.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.kernel import fatal, jobenv, layout
from hpctrain.kernel import snapshot as store

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "ddp_torch.py"
EVERY = 4
# no disk checkpoint before the kill at step 25+: the restart can only resume from memory (or 0)
SCRIPT_ARGS = ["--steps", "200", "--save-every", "100", "--snapshot-every", str(EVERY)]


@pytest.fixture()
def job(tmp_path, monkeypatch):
    monkeypatch.setenv(jobenv.RUN_DIR, str(tmp_path / "run"))
    monkeypatch.setenv(jobenv.JOB_ID, "51")
    monkeypatch.setenv(jobenv.RESTART_COUNT, "0")
    monkeypatch.setenv(jobenv.SNAPSHOT_DIR, str(tmp_path / "shm"))
    monkeypatch.setenv(jobenv.JOB_KEY, "5e" * 32)
    for name in (fatal.TORCHRUN_RESTARTS, jobenv.IN_JOB_RESTART, "SLURMD_NODENAME", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "run"


def test_an_in_job_restart_loads_the_newer_of_snapshot_and_disk(job, monkeypatch):
    import torch

    from hpctrain import runtime

    model = torch.nn.Linear(4, 2)
    state = lambda: {"model": model.state_dict(), "tag": int(model.weight.sum() * 1e6)}  # noqa: E731
    ckpt = runtime.Checkpoint(snapshot_every=2)
    drawn = {}
    for step in range(1, 6):
        with torch.no_grad():
            model.weight.add_(torch.rand(2, 4))  # the RNG moves every step
        if step == 2:
            ckpt.save(step, state())
        ckpt.snapshot(step, state)  # 2: saved to disk, no snapshot; 4: a snapshot
        drawn[step] = (torch.rand(3), state()["tag"])
    assert ckpt.snapshot_every == 2
    folder = store.node_folder(job)
    ckpt._snaps._wait()  # the snapshot of 4 is stored by a thread while training goes on
    assert sorted(store.listing(folder)[0]) == [4]
    assert (job / "checkpoints" / "latest").read_text() == "step-00000002\n"  # never a snapshot

    # a first start of the job (no in-job restart): the disk checkpoint
    found = runtime.Checkpoint().load()
    assert found is not None and (found.step, found.from_memory) == (2, False)

    # an in-job restart: the snapshot of 4 is newer than the disk's 2, with its RNG
    monkeypatch.setenv(fatal.TORCHRUN_RESTARTS, "1")
    torch.manual_seed(123)
    again = runtime.Checkpoint(snapshot_every=2)
    found = again.load()
    assert found is not None and (found.step, found.from_memory) == (4, True)
    assert found.state["tag"] == drawn[4][1]
    assert torch.equal(torch.rand(3), drawn[4][0])  # the RNG of the step it was taken at
    (ev,) = [e for e in _lines(job / layout.EVENTS) if e["event"] == "in_job_restart"]
    assert ev["resumed_step"] == 4 and ev["source"] == "runtime" and ev["restart"] == 1, ev

    # a disk checkpoint newer than every snapshot wins
    again.save(6, state())
    found = runtime.Checkpoint().load()
    assert found is not None and (found.step, found.from_memory) == (6, False)

    # a damaged snapshot is never loaded: the disk
    again.snapshot(8, state)
    again._snaps._wait()
    assert sorted(store.listing(folder)[0]) == [4, 8]
    (folder / "rank-0" / "step-00000008.bin").write_bytes(b"\0" * 10)
    found = runtime.Checkpoint().load()
    assert found is not None and (found.step, found.from_memory) == (6, False)

    # the run's end: this node's snapshots of this job start are gone
    again.close()
    assert not folder.exists()


def test_snapshots_are_off_outside_a_job_or_when_set_off(job, monkeypatch):
    import torch

    from hpctrain import runtime

    model = torch.nn.Linear(2, 2)
    off = runtime.Checkpoint(snapshot_every=0)
    for step in range(1, 9):
        off.snapshot(step, model.state_dict)
    assert not store.node_folder(job).exists()
    monkeypatch.delenv(jobenv.JOB_ID)
    outside = runtime.Checkpoint(snapshot_every=1)
    outside.snapshot(1, model.state_dict)
    assert not store.run_folder(job).exists()
    with pytest.raises(ValueError, match="snapshot_every=-1"):
        runtime.Checkpoint(snapshot_every=-1)


def test_the_auto_interval_keeps_snapshots_under_their_budget(job):
    import time

    import torch

    from hpctrain import runtime

    model = torch.nn.Linear(64, 64)
    ckpt = runtime.Checkpoint()  # auto: the first snapshots' cost against the median step
    for step in range(1, 10):
        time.sleep(0.01)
        ckpt.snapshot(step, model.state_dict)
        if step < 9:  # still measuring: after 3 measured steps, a snapshot at every step
            assert ckpt.snapshot_every is None
    assert ckpt.snapshot_every is not None and ckpt.snapshot_every >= 1
    assert [t["step"] for t in ckpt._snaps.taken][:5] == [4, 5, 6, 7, 8]


def _lines(path: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except OSError:
        return []


# ---------------------------------------------------------------- live, local profile


@pytest.fixture(scope="module")
def script_reference(tmp_path_factory) -> str:
    from test_in_job_restart import Job

    job = Job(tmp_path_factory.mktemp("script-ref"), "ref")
    job.submit("--script", str(EXAMPLE), train=SCRIPT_ARGS, wait=True)
    assert job.state() == "COMPLETED", (job.run / "logs" / "batch.log").read_text()[-3000:]
    return (job.run / layout.FINAL_PARAMS).read_text()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_killed_rank_of_a_user_script_restarts_from_memory_bit_identical(
    tmp_path, script_reference
):
    import time

    from test_in_job_restart import Job

    job = Job(tmp_path, "kill")
    started = time.monotonic()
    job.submit("--script", str(EXAMPLE), train=SCRIPT_ARGS)
    reached, killed = job.kill_one(1, after_step=25)
    assert job.wait() == "COMPLETED", (job.run / "logs" / "batch.log").read_text()[-3000:]
    assert (job.run / layout.FINAL_PARAMS).read_text() == script_reference  # exact resume
    assert [s["restart_count"] for s in _lines(job.run / layout.RESTARTS)] == [0]  # no requeue
    assert not job.events("requeue") and len(job.events("done")) == 1
    (ev,) = job.events("in_job_restart")
    assert ev["restart"] == 1 and ev["reason"] == "worker failed" and ev["source"] == "runtime"
    # resumed from a snapshot (no disk checkpoint before step 100), within one interval or two
    # (the killed rank may have died inside the newest one)
    assert ev["resumed_step"] > 0 and ev["resumed_step"] % EVERY == 0, ev
    assert reached - 2 * EVERY <= ev["resumed_step"] <= ev["reached_step"], (reached, ev)
    assert ev["steps_redone"] <= 2 * EVERY, ev
    logs = "".join(p.read_text() for p in (job.run / "logs").glob("*.log"))
    assert f"resumed from the in-memory snapshot of step {ev['resumed_step']}" in logs
    assert f"step {ev['resumed_step']}/200 (from memory)" in logs
    assert not list((job.run / "checkpoints").glob("step-000000[0-9][0-9]"))  # only 100 and 200
    assert not store.run_folder(job.run).exists() or not any(
        store.run_folder(job.run).rglob("*.bin")
    )  # cleaned at the end (close)
    after = next(r["time"] for r in job.steps() if r["time"] > killed and r["step"] > reached)
    print(
        f"\nkill -> next new step: {after - killed:.1f} s; whole run {time.monotonic() - started:.0f}"
        f" s (event: {ev})"
    )
