"""The run-folder readers at scale (issue 37), as behaviour, not time: `runs` over 1,000 run
folders parses each run.yaml once and only the lines its table shows; the shown-lines reader
agrees with the whole file's safe parse (and steps aside for anything else); `report` keeps a
metric line in a few dozen bytes; a sweep's table reads a block of each point's metrics.jsonl.
The CPU seconds and peak memory are benchmarks/scale_runs.py's."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hpctrain.cli import main
from hpctrain.runs import folder, record
from hpctrain.runs.folder import RunDir

RUNS = 1000


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _real_yaml(home: Path) -> Path:
    """A run folder with run.yaml as `submit` writes it (the local profile, train_entry)."""
    from hpctrain.jobs.request import JobRequest
    from hpctrain.profiles import resolve

    profile = resolve("local", {})
    run = RunDir(home / "made" / "r0")
    request = JobRequest.build(profile, name="r0", nodes=1, gpus=2, strategy="fsdp")
    run.create(profile=profile, request=request, script="echo\n")
    return run.path


def test_runs_parses_each_run_yaml_once_from_its_shown_lines(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _real_yaml(home)
    for i in range(RUNS):
        shutil.copytree(real, home / "runs" / f"r{i:04d}", copy_function=os.link)
    seen: list[str] = []
    whole: list[Path] = []
    shown, load = record.shown, folder._load
    monkeypatch.setattr(folder, "shown", lambda text: seen.append(text) or shown(text))
    monkeypatch.setattr(folder, "_load", lambda text, path: whole.append(path) or load(text, path))

    out = CliRunner().invoke(main, ["runs", "--json"])
    assert out.exit_code == 0, out.output
    listed = json.loads(out.output)  # the copies, and the original (in the run index)
    rows = [r for r in listed if r["path"].startswith(str(home / "runs"))]
    assert len(rows) == RUNS and len(seen) == len(listed) == RUNS + 1  # one parse a run
    assert whole == []  # and never the whole file
    want = {"state", "nodes", "gpus_per_node", "strategy", "scheduler", "profile", "created"}
    first = {k: rows[0][k] for k in want}
    assert first["nodes"] == 1 and first["gpus_per_node"] == 2 and first["strategy"] == "fsdp"
    assert first["scheduler"] == "local" and first["profile"] == "local"
    assert all({k: r[k] for k in want} == first for r in rows)
    assert sorted(r["name"] for r in rows) == [f"r{i:04d}" for i in range(RUNS)]

    table = CliRunner().invoke(main, ["runs"]).output
    assert sum(" 1 x 2 " in line and "fsdp" in line for line in table.splitlines()) == RUNS + 1


def test_resume_still_reads_the_whole_file(home: Path) -> None:
    run = RunDir(_real_yaml(home))
    rec = run.record()
    want = yaml.safe_load(run.run_yaml.read_text())
    assert dict(rec.request) == want["request"] and dict(rec.profile) == want["profile"]
    assert run.frozen() == want


VALUES: list[object] = [
    *("a", "", " x", "x ", "1.5", "yes", "No", "on", "0x1f", "1_000", "1:30", "2026-12-07"),
    *("~", "null", "NULL", "-", "--x", "- x", "a: b", "a #b", "a#b", "#a", "'q'", '"d"'),
    *("it's", "x:", "x:y", "é", "a\nb", "\t", "a\tb", "12", "-3", "+4", "007", "1e5", ".inf"),
    *("True", "y", "=", "(a)", "[a]", "{a}", "*a", "&a", "!a", "%a", "@a", "`a", "|", ">"),
    *("?", "? a", "a" * 90 + " " + "b" * 90, "\x85", "\u2028", "a\rb", "€", ",a", "~a", "$H"),
    *(5, -2, True, None, 1.5, 2**70, [1], {"k": "v"}),
]


PLACES = [
    ("cwd",),
    ("profile", "name"),
    ("profile", "preemption", "signal"),
    ("request", "args", 1),
    ("request", "entry", "kind"),
    ("request", "strategy"),
]


def test_the_shown_lines_read_as_the_whole_file_does(home: Path) -> None:
    """Each value in each shown place: the shown-lines reader gives what the safe loader gives
    the whole file, or steps aside (None) for the whole file's parse."""
    doc = yaml.safe_load(_real_yaml(home).joinpath("run.yaml").read_text())
    doc["request"]["args"] = ["--max-steps", "2", "--x=1"]
    fast = 0
    for value in VALUES:
        for where in PLACES:
            changed = json.loads(json.dumps(doc))
            parent = changed
            for key in where[:-1]:
                parent = parent[key]
            parent[where[-1]] = value
            text = yaml.dump(changed, Dumper=yaml.CSafeDumper, sort_keys=True)
            got = record.shown(text)
            if got is None:
                continue
            fast += 1
            full = yaml.load(text, Loader=yaml.CSafeLoader)  # what folder._load uses
            assert got["cwd"] == full["cwd"], (value, where)
            for top, keys in record._SHOWN.items():
                assert got[top] == {k: full[top][k] for k in keys if k in full[top]}, (value, where)
    assert fast > len(VALUES) * len(PLACES) // 3  # most values take the fast way


@pytest.mark.parametrize(
    "text",
    [
        "profile: {name: local}\nrequest: {nodes: 1}\n",  # flow style
        "profile:\n  name: &a local\nrequest:\n  nodes: 1\n",  # an anchor
        "profile:\n  name: !!python/name:os.system x\nrequest:\n  nodes: 1\n",  # a tag
        "'profile':\n  name: x\nrequest:\n  nodes: 1\n",  # a quoted key
        "profile:\n  name: a\n    b\nrequest:\n  nodes: 1\n",  # a value over two lines
        "---\nprofile:\n  name: a\n",  # a document marker
        "profile:\n  name: a\n\nrequest:\n  nodes: 1\n",  # a blank line
        "profile:\n  name: a\x07\nrequest:\n  nodes: 1\n",  # a control character
    ],
)
def test_anything_but_hpctrains_shape_is_the_whole_files_parse(text: str) -> None:
    assert record.shown(text) is None


def test_a_tag_in_run_yaml_is_still_a_broken_run(home: Path) -> None:
    run = RunDir(_real_yaml(home))
    run.run_yaml.write_text(run.run_yaml.read_text().replace("name: local", "name: !!binary eA=="))
    with pytest.raises(record.BrokenRun, match="run.yaml"):
        RunDir(run.path).record()


LINES = 100_000


def test_report_keeps_a_metric_line_in_a_few_dozen_bytes(home: Path) -> None:
    from hpctrain.report.data import load

    run = _real_yaml(home)
    with (run / "metrics.jsonl").open("w") as f:
        for step in range(1, LINES + 1):
            row = {"step": step, "loss": 3.0 - step * 1e-5, "samples_per_s": 900.0 + step % 5}
            f.write(
                json.dumps(
                    {**row, "step_time_s": 0.05, "time": 1.8e9 + step, "mem_peak_gib": [1.0, 2.0]}
                )
                + "\n"
            )
        f.write('{"step": 7')  # a killed writer's last line
    tracemalloc.start()
    try:
        rd = load(RunDir(run))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(rd.metrics) == LINES
    last = rd.metrics[-1]
    assert last.step == LINES and last.mem_peak_gib == [2.0] and last.max_steps is None
    assert rd.metrics.middle("samples_per_s") == 902.0
    # 7 columns of 8 bytes: ~60 bytes a line with the arrays' headroom; a dict (or a Metric
    # object) a line is above 500
    assert peak / LINES < 150, peak / LINES


def test_a_sweeps_table_reads_a_block_of_each_points_metrics(home: Path) -> None:
    from hpctrain.service import points

    sweep = home / "runs" / "sw"
    listed = []
    for i in range(4):
        point = sweep / f"{i}-lr={i}"
        point.mkdir(parents=True)
        lines = (
            json.dumps({"step": s, "loss": 1.0 / s, "time": 1.8e9 + s}) for s in range(1, 20_001)
        )
        (point / "metrics.jsonl").write_text("\n".join(lines) + "\n" + '{"step": 20001, "lo')
        listed.append({"index": i, "folder": point.name, "values": {"lr": i}})
    (sweep / "sweep.json").write_text(json.dumps({"points": listed}))
    size = (sweep / "0-lr=0" / "metrics.jsonl").stat().st_size

    def read_bytes() -> int:
        io = Path("/proc/self/io").read_text()
        return int(next(line.split()[1] for line in io.splitlines() if line.startswith("rchar")))

    before = read_bytes()
    rows = points.table(sweep)
    spent = read_bytes() - before
    assert [r.final_loss for r in rows] == [1 / 20_000] * 4
    assert size > 500_000 and spent < 4 * 16_384, spent  # a block a point, not 4 x 0.9 MB
