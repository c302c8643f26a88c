"""How often hpctrain asks Slurm, at 10, 100 and 1,000 runs (issue 37: every operation's cost flat
in the number of runs). sacct, scontrol and scancel are stand-ins (tests/standins/scale/) that log
each call and answer for thousands of jobs and array elements; the run folders are fabricated the
way submit writes them. Before: `runs` over N runs made N sacct calls asking N(N+1)/2 ids, plus one
scontrol per live run; a 1,000-point sweep's status 1,000 sacct, its cancel 1,000 scancel."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpctrain import dispatch
from hpctrain.cli import main
from hpctrain.dispatch import sacct, slurm
from hpctrain.runs.folder import RunDir
from hpctrain.runs.sweepdir import write as write_sweep
from hpctrain.service import points
from hpctrain.service.logs import follow

STANDINS = Path(__file__).resolve().parent / "standins" / "scale"
FIRST = 1000  # the first plain job id


@pytest.fixture
def slurm_log(tmp_path, monkeypatch):
    """The stand-ins first on PATH; returns the log file's path (one JSON argv a call)."""
    log = tmp_path / "calls.jsonl"
    log.touch()
    monkeypatch.setenv("PATH", f"{STANDINS}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SCALE_LOG", str(log))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def counts(log: Path) -> dict[str, int]:
    out = {"sacct": 0, "scontrol": 0, "scancel": 0}
    for argv in calls(log):
        out[argv[0]] += 1
    return out


RUN_YAML = yaml.safe_dump(
    {
        "profile": {"scheduler": "slurm", "name": "loopback"},
        "request": {"name": "scale", "nodes": 1, "gpus": 1},
    }
)


def fabricate(folder: Path, job_id: str, kind: str = "submit") -> None:
    """A Slurm run folder as submit leaves it (run.yaml, jobs.jsonl, logs/)."""
    (folder / "logs").mkdir(parents=True)
    (folder / "run.yaml").write_text(RUN_YAML)
    line = {"job_id": job_id, "kind": kind, "scheduler": "slurm", "time": "2026-12-07T00:00:00Z"}
    (folder / "jobs.jsonl").write_text(json.dumps(line) + "\n")


def plain_runs(n: int, monkeypatch) -> None:
    for i in range(n):
        fabricate(Path("runs") / f"r{i:04d}", str(FIRST + i))
    monkeypatch.setenv("SCALE_PLAIN", f"{FIRST}:{FIRST + n}")


@pytest.mark.parametrize("n", [10, 100, 1000])
def test_runs_and_status_ask_slurm_twice_at_any_size(n, slurm_log, monkeypatch):
    plain_runs(n, monkeypatch)
    # both commands list through one function (service.status.summaries); 1,000 runs: `runs` only
    for command in (["runs", "--json"], ["status", "--json"])[: 1 if n == 1000 else 2]:
        slurm_log.write_text("")
        out = CliRunner().invoke(main, command)
        assert out.exit_code == 0, out.output
        rows = json.loads(out.output)
        assert len(rows) == n
        got = {r["job_id"]: r["scheduler_state"] for r in rows}
        assert got == {str(j): sacct_state(j) for j in range(FIRST, FIRST + n)}
        made = counts(slurm_log)
        assert made["sacct"] <= 2 and made["scontrol"] <= 1, (command, made)
        asked = [a for a in calls(slurm_log) if a[0] == "sacct"]
        assert sum(len(a[-1].split(",")) for a in asked) == n  # each id asked once
        controller = [a for a in calls(slurm_log) if a[0] == "scontrol"]
        assert controller == [["scontrol", "show", "job", "-o"]]  # all jobs, read once


def sacct_state(job: int) -> str:
    return ("COMPLETED", "RUNNING", "PENDING")[job % 3]


def test_an_argument_never_grows_without_bound():
    many = [str(n) for n in range(10_000)]
    commands = sacct.commands(many)
    assert len(commands) == 10
    assert max(len(",".join(c)) for c in commands) < 16 * 1024
    # an array's elements are asked by the array's id: a sweep of 10,000 points is one short call
    assert sacct.commands([f"77_{i}" for i in range(10_000)]) == [
        ["sacct", "-X", "-o", sacct.FIELDS, "--parsable2", "-j", "77"]
    ]


@pytest.fixture
def sweep(slurm_log, monkeypatch):
    """A 1,000-point Slurm sweep (array 500): every 100th point RUNNING, the others COMPLETED
    (a cancel writes each live point's CANCEL durably: 10 fsyncs, not 500)."""
    folder = Path("runs") / "grid"
    entries = []
    for i in range(1000):
        name = f"{i}-lr={i}"
        fabricate(folder / name, f"500_{i}", kind="sweep")
        entries.append({"index": i, "folder": name, "values": {"lr": i}})
    folder.mkdir(exist_ok=True)
    write_sweep(folder, {"name": "grid", "points": entries})
    monkeypatch.setenv("SCALE_ARRAYS", "500:1000")
    monkeypatch.setenv("SCALE_LIVE_EVERY", "100")
    return folder


def test_a_1000_point_sweep_status_is_one_sacct_and_its_cancel_one_scancel(sweep, slurm_log):
    rows = points.table(sweep.resolve())
    assert [r.state for r in rows] == [("RUNNING", "COMPLETED")[i % 100 > 0] for i in range(1000)]
    assert counts(slurm_log) == {"sacct": 1, "scontrol": 1, "scancel": 0}

    slurm_log.write_text("")
    cancelled = points.cancel(sweep.resolve())
    assert len(cancelled) == 10  # the running ones
    cancels = [a for a in calls(slurm_log) if a[0] == "scancel"]
    assert len(cancels) == 1
    assert sorted(cancels[0][1:]) == sorted(f"500_{i}" for i in range(0, 1000, 100))
    assert counts(slurm_log)["sacct"] == 2  # the states before and after
    # every cancelled point says so in its folder (the batch shell and status read it)
    assert (sweep / "0-lr=0" / "CANCEL").read_text() == "500_0\n"
    assert not (sweep / "1-lr=1" / "CANCEL").exists()


def test_the_controller_listing_names_array_elements_and_ranges():
    text = (
        "JobId=44 ArrayJobId=43 ArrayTaskId=0 JobName=a b JobState=RUNNING\n"
        "JobId=43 ArrayJobId=43 ArrayTaskId=1-3%2 JobState=PENDING\n"
        "JobId=50 JobName=x JobState=COMPLETING\n"
    )
    got = slurm.listing(text)
    assert got["43_0"] == got["44"] == "RUNNING"
    assert got["43_1"] == got["43_3"] == "PENDING"
    assert got["43"] == "RUNNING"  # the array's id: its first record, as scontrol answers it
    assert got["50"] == "COMPLETING" and "43_4" not in got


def test_the_poll_backs_off_to_one_question_a_minute():
    times = dispatch.schedule(5.0, 60.0, 600.0)
    assert times[:5] == [0.0, 5.0, 15.0, 35.0, 75.0]
    for minute in range(1, 10):  # after the first minute: at most one poll (sacct + scontrol)
        assert sum(minute * 60 <= t < (minute + 1) * 60 for t in times) <= 1
    assert dispatch.delay(0, 5.0, 60.0) == 5.0 and dispatch.delay(9, 5.0, 60.0) == 60.0


def test_a_change_in_the_run_folder_asks_again_at_once(tmp_path):
    run_dir = tmp_path / "r"
    fabricate(run_dir, "7")
    poll = dispatch.Poll(RunDir(run_dir), 5.0, 60.0)
    assert poll.due(0.0)
    poll.answered(0.0, changed=True)
    for t in (5.0, 15.0, 35.0):
        assert not poll.due(t - 1) and poll.due(t)
        poll.answered(t, changed=False)
    assert not poll.due(70.0)  # next at 75
    (run_dir / "events.jsonl").write_text('{"event": "done"}\n')
    assert poll.due(70.0)  # the batch shell wrote an event: ask now, not at 75
    poll.answered(70.0, changed=False)
    assert not poll.due(74.0) and poll.due(75.0)  # and back to every 5 s


def test_follow_asks_once_for_an_ended_job_and_reads_the_logs(slurm_log, monkeypatch):
    plain_runs(3, monkeypatch)
    run = RunDir(Path("runs") / "r0002")  # job 1002: COMPLETED
    (run.path / "logs" / "node-0.log").write_text("step 1\nstep 2\n")
    shown: list[str] = []
    follow(run, [], shown.append, new_nodes=True)
    assert "".join(shown) == "step 1\nstep 2\n"
    assert counts(slurm_log) == {"sacct": 1, "scontrol": 0, "scancel": 0}
