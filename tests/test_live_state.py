"""What `status`, `runs`, `report` and `submit --wait` say while a run is preempted and requeued,
and that they count restarts and state the throughput one way (issue 34: during the 60 s after a
save and exit 75, `--wait` kept printing `RUNNING step 132/300 ... ETA` and `status` said
`restarts: 0 (2 start(s))` where `report` said `restarts 1`; the live line said 1847 samples/s,
`report` 854). Fabricated run folders, written the way the batch script and the ranks write them;
the scheduler's answer is a stand-in (the phase is read from the run folder, not from it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpctrain import dispatch
from hpctrain.cli import main
from hpctrain.kernel.files import utc_now
from hpctrain.report.data import load
from hpctrain.report.summary import summarize
from hpctrain.report.summary import text as report_text
from hpctrain.runs.folder import RunDir
from hpctrain.runs.progress import Follower, describe, snapshot
from hpctrain.service import status

T0 = 1_800_000_000.0
SAID = {"state": "RUNNING"}  # the stand-in scheduler's answer


def _lines(path: Path, *rows: dict[str, object]) -> None:
    with path.open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def start(run: Path, at: float, job: str = "7", count: int = 0) -> None:
    _lines(
        run / "restarts.jsonl",
        {"time": utc_now(at), "job_id": job, "restart_count": count, "host": "n1"},
    )


def event(run: Path, at: float, name: str, **fields: object) -> None:
    _lines(run / "events.jsonl", {"time": utc_now(at), "event": name, **fields})


def metrics(run: Path, steps: range, at: float, rate: float = 854.0) -> None:
    _lines(
        run / "metrics.jsonl",
        *(
            {"step": s, "loss": 2.0, "samples_per_s": rate, "step_time_s": 0.5}
            | {"max_steps": 300, "time": at + i * 0.5}
            for i, s in enumerate(steps)
        ),
    )


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A Slurm run (job 7) that started at T0 and trained to step 132; the scheduler's state is
    what the test writes to SAID (RUNNING)."""
    folder = tmp_path / "runs" / "pre"
    (folder / "logs").mkdir(parents=True)
    (folder / "run.yaml").write_text(
        yaml.safe_dump(
            {
                "profile": {"scheduler": "slurm", "name": "loopback"},
                "request": {"name": "pre", "nodes": 2, "gpus": 1},
            }
        )
    )
    _lines(folder / "jobs.jsonl", {"job_id": "7", "kind": "submit", "scheduler": "slurm"})
    start(folder, T0)
    metrics(folder, range(1, 133), T0 + 1)
    SAID["state"] = "RUNNING"
    monkeypatch.setattr(dispatch, "state", lambda _run: SAID["state"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return folder


def shown(folder: Path) -> tuple[str, int, str]:
    """(the state `status` shows, its restarts, its text)."""
    row = status.summary(RunDir(folder))
    out = CliRunner().invoke(main, ["status", "pre"])
    assert out.exit_code == 0, out.output
    return row.state, row.restarts, out.output


def follow(folder: Path) -> str:
    lines: list[str] = []
    Follower(folder, live=False, out=lines.append)(SAID["state"])
    return lines[-1]


def test_a_preemption_and_its_requeue_show_as_they_happen(run):
    state, restarts, text = shown(run)
    assert (state, restarts) == ("RUNNING", 0) and "ETA" in text

    event(run, T0 + 70, "signal", signal="USR2")
    state, _, text = shown(run)
    assert state == "RUNNING" and "preemption signal USR2: saving at the next step" in text

    # rank 0 saved step 132 and left with 75; the job still runs (torchrun's store times out)
    event(run, T0 + 71, "preempted", step=132, source="runtime")
    state, restarts, text = shown(run)
    assert (state, restarts) == ("PREEMPTED", 0), text
    assert "saved step 132; leaving, the requeue follows; the scheduler says RUNNING" in text
    assert "ETA" not in text and "samples/s" not in text and "step 132/300" in text
    line = follow(run)
    assert " PREEMPTED (saved step 132" in line and "ETA" not in line, line

    # the batch shell requeued it: counted at once, whether Slurm says RUNNING still or PENDING
    event(run, T0 + 131, "requeue", reason="preempted")
    for said in ("RUNNING", "PENDING", "REQUEUED"):
        SAID["state"] = said
        state, restarts, text = shown(run)
        assert (state, restarts) == ("REQUEUED", 1), (said, text)
        assert "preempted; saved step 132; waiting to start again" in text
        assert "restarts: 1 (1 start(s) of the script, 1 submission(s))" in text
        assert " REQUEUED (preempted; saved step 132" in follow(run)

    # it starts again: RUNNING, loading; then training
    SAID["state"] = "RUNNING"
    start(run, T0 + 200, count=1)
    state, restarts, text = shown(run)
    assert (state, restarts) == (
        "RUNNING",
        1,
    ) and "started again: loading the checkpoint, no step yet" in text, text
    assert "ETA" not in text
    metrics(run, range(133, 140), T0 + 230)
    state, restarts, text = shown(run)
    assert (state, restarts) == ("RUNNING", 1) and "ETA" in text, text
    assert "started again" not in text and "the scheduler says" not in text
    assert json.loads(CliRunner().invoke(main, ["runs", "--json"]).output)[0]["restarts"] == 1


def test_the_preempted_marker_alone_says_preempted(run):
    (run / "PREEMPTED").write_text("")  # launcher srun: a rank left 75, no event from the script
    assert shown(run)[0] == "PREEMPTED"


def test_a_scheduler_state_that_ended_is_shown_as_it_is(run):
    event(run, T0 + 71, "preempted", step=132)
    SAID["state"] = "PREEMPTED"  # max_restarts reached: the job ended preempted
    row = status.summary(RunDir(run))
    assert row.state == "PREEMPTED" and row.phase is None and row.restarts == 0
    event(run, T0 + 300, "resume")  # `hpctrain resume`: a new job, queued
    _lines(run / "jobs.jsonl", {"job_id": "8", "kind": "resume", "scheduler": "slurm"})
    SAID["state"] = "PENDING"
    assert status.summary(RunDir(run)).state == "PENDING"


def test_status_runs_and_report_count_restarts_alike(run):
    """A resume is a restart for all three (it was 0 in status, 1 in report); a chain's planned
    segments are none."""
    _lines(run / "jobs.jsonl", {"job_id": "8", "kind": "resume", "scheduler": "slurm"})
    start(run, T0 + 500, job="8")
    metrics(run, range(120, 200), T0 + 510)
    SAID["state"] = "COMPLETED"
    event(run, T0 + 600, "done")
    state, restarts, text = shown(run)
    assert restarts == 1 and "restarts: 1 (2 start(s) of the script, 2 submission(s))" in text
    assert json.loads(CliRunner().invoke(main, ["runs", "--json"]).output)[0]["restarts"] == 1
    assert summarize(load(RunDir(run)), sacct=False).restarts == 1

    chained = run.parent / "chained"
    (chained / "logs").mkdir(parents=True)
    (chained / "run.yaml").write_text((run / "run.yaml").read_text())
    for job, at in (("11", T0), ("12", T0 + 100)):
        _lines(chained / "jobs.jsonl", {"job_id": job, "kind": "chain", "scheduler": "slurm"})
        start(chained, at, job=job)
    assert status.summary(RunDir(chained)).restarts == 0
    assert summarize(load(RunDir(chained)), sacct=False).restarts == 0


def test_live_and_report_throughput_are_both_medians_and_say_so(run):
    metrics(run, range(133, 134), T0 + 80, rate=1847.0)  # one fast logging window at the end
    live = describe(snapshot(run))
    assert "854 samples/s (median, last 10 steps)" in live, live
    said = report_text(summarize(load(RunDir(run)), sacct=False))
    assert "854 samples/s (median over the run)" in said, said


def test_a_term_is_a_preemption_only_when_the_batch_shell_says_so() -> None:
    """preemption.signal TERM: the trap writes `as: preemption`; a plain TERM is a cancel."""
    from hpctrain.runs.phase import phase

    starts = [{"time": "2026-12-07T10:00:00Z", "job_id": "7"}]
    term = {"event": "signal", "signal": "TERM", "time": "2026-12-07T10:00:05Z"}
    assert phase("RUNNING", starts, [term]).note is None
    noted = phase("RUNNING", starts, [{**term, "as": "preemption"}]).note
    assert noted == "preemption signal TERM: saving at the next step"
