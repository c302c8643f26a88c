"""`runs` over many run folders (issue 37), as behaviour: a long listing is the plain table (rich
lays out every cell: 8.5 s of CPU at 10,000 rows), a short one keeps rich's; each folder is
checked once and each of its files read once; `resume` still parses the whole run.yaml before
it asks the scheduler; a pipe in a run folder is never waited on. The CPU seconds are
benchmarks/scale_runs.py's."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from test_scale_runs import home as home  # the fixture: XDG folders and the cwd in tmp_path

from hpctrain import dispatch
from hpctrain.cli import main
from hpctrain.cli import runs as runs_cli
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.rundir import RunFolder
from hpctrain.runs import folder, record
from hpctrain.runs.folder import RunDir, all_runs
from hpctrain.runs.record import BrokenRun
from hpctrain.service import resume, status


def _run(home: Path, name: str, extra: str = "") -> Path:
    """A local run folder: run.yaml in the shape safe_dump writes, one submission, one start."""
    folder = home / "runs" / name
    (folder / "logs").mkdir(parents=True)
    doc = {
        "created": "2026-12-07T10:00:00Z",
        "profile": {"name": "local", "scheduler": "local", "slurm": {"account": None}},
        "request": {"name": name, "nodes": 1, "gpus": 2, "strategy": "fsdp"},
    }
    (folder / "run.yaml").write_text(yaml.safe_dump(doc, sort_keys=True) + extra)
    (folder / "jobs.jsonl").write_text('{"job_id": "12", "kind": "submit"}\n')
    (folder / "restarts.jsonl").write_text('{"time": "2026-12-07T10:00:01Z", "job_id": "12"}\n')
    (folder / "state.json").write_text('{"state": "COMPLETED"}\n')
    return folder


def test_a_long_listing_is_the_plain_table_and_a_short_one_rich(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(3):
        _run(home, f"r{i}")
    monkeypatch.setattr(runs_cli, "RICH_ROWS", 3)
    short = CliRunner().invoke(main, ["runs"])
    assert short.exit_code == 0, short.output
    assert (
        "┃ name" in short.output and sum("│ r" in line for line in short.output.splitlines()) == 3
    )

    monkeypatch.setattr(runs_cli, "RICH_ROWS", 2)
    long = CliRunner().invoke(main, ["runs"])
    assert long.exit_code == 0, long.output
    lines = long.output.splitlines()
    assert lines[0].split() == ["name", "state", "job", "nodes", "x", "gpus", "strategy"] + [
        "restarts",
        "ckpt",
        "step",
        "created",
    ]
    assert [line.split()[:3] for line in lines[2:]] == [["r0", "COMPLETED", "12"]] + [
        ["r1", "COMPLETED", "12"],
        ["r2", "COMPLETED", "12"],
    ]
    assert all(" 1 x 2 " in line and "fsdp" in line for line in lines[2:])
    assert "│" not in long.output


def test_runs_checks_each_folder_once_and_reads_each_file_once(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(3):
        _run(home, f"r{i}")
    checked: list[Path] = []
    reads: collections.Counter[str] = collections.Counter()
    check, regular = RunFolder.check_safe, record.regular
    monkeypatch.setattr(
        RunFolder, "check_safe", lambda self: checked.append(self.path) or check(self)
    )
    counted = lambda path: reads.update([str(path)]) or regular(path)  # noqa: E731
    monkeypatch.setattr(record, "regular", counted)  # jsonl() and read()
    monkeypatch.setattr(folder, "regular", counted)  # run.yaml

    rows = status.summaries(all_runs(home / "runs"))
    assert [r.state for r in rows] == ["COMPLETED"] * 3 and [r.restarts for r in rows] == [0] * 3
    assert sorted(checked) == sorted(home / "runs" / f"r{i}" for i in range(3))
    named = collections.Counter(Path(p).name for p in reads)
    assert max(reads.values()) == 1  # no file of a run read twice
    for name in ("run.yaml", "jobs.jsonl", "restarts.jsonl", "events.jsonl", "state.json"):
        assert named[name] == 3, (name, named)


def test_resume_parses_the_whole_run_yaml_before_asking_the_scheduler(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a line `runs` never reads (under profile.slurm) that YAML cannot read
    folder = _run(home, "y")
    text = (folder / "run.yaml").read_text().replace("account: null", "account: 'open")
    (folder / "run.yaml").write_text(text)
    run = RunDir(folder)
    assert run.record().nodes == 1  # the listing reads its lines and shows the run
    asked: list[RunDir] = []
    monkeypatch.setattr(dispatch, "state", lambda r: asked.append(r) or "COMPLETED")
    with pytest.raises(BrokenRun, match="cannot be read"):
        resume.plan(run)
    assert asked == []


def test_a_pipe_in_a_run_folder_is_never_waited_on(home: Path) -> None:
    folder = _run(home, "p")
    os.unlink(folder / "jobs.jsonl")
    os.mkfifo(folder / "jobs.jsonl")
    run = RunDir(folder)
    assert record.regular(folder / "jobs.jsonl") is None and run.jobs() == []
    os.unlink(folder / "run.yaml")
    os.mkfifo(folder / "run.yaml")
    with pytest.raises(UserError, match="not a run folder"):
        RunDir(folder).record()
