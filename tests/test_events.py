"""Every write into a run folder: the batch shell's events are valid JSON whatever the message,
with the same UTC clock and fields as the Python writers (RunFolder); atomic writes leave no debris.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from hpctrain.kernel import jobenv, layout
from hpctrain.kernel.files import TIME_FORMAT, utc_now, write_atomic
from hpctrain.kernel.rundir import RunFolder

REPO = Path(__file__).resolve().parent.parent
UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\Z")
HOSTILE = [
    "plain",
    'a "quoted" word',
    "back\\slash \\n not a newline",
    "two\nlines\r\n",
    "tab\there",
    "bell\x07 esc\x1b[31m del\x7f",
    "$(touch /tmp/pwned) `id` ${HOME} '; echo x",
    "ünïcödé ✓ 日本",
    "",
]


def shell_helpers() -> str:
    """The event helpers exactly as the rendered script has them (the golden local script)."""
    text = (REPO / "tests" / "golden" / "local.sh").read_text()
    start, end = text.index("hpctrain_now() {"), text.index("hpctrain_fail() {")
    return text[start:end]


def run_shell(run_dir: Path, body: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = f"set -uo pipefail\n{shell_helpers()}\n{body}\n"
    full = {
        **os.environ,
        jobenv.RUN_DIR: str(run_dir),
        jobenv.JOB_ID: "4242",
        jobenv.RESTART_COUNT: "3",
        "LC_ALL": "C.UTF-8",
        **env,
    }
    return subprocess.run(
        ["bash", "-c", script], env=full, capture_output=True, text=True, timeout=60
    )


def test_batch_shell_events_are_valid_json_whatever_the_message(tmp_path: Path) -> None:
    body = "\n".join(
        f'hpctrain_event failed reason "$MSG{i}" exit_code:= 7 note:= "$MSG{i}"'
        for i in range(len(HOSTILE))
    )
    proc = run_shell(tmp_path, body, {f"MSG{i}": m for i, m in enumerate(HOSTILE)})
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / layout.EVENTS).read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(HOSTILE)
    for line, message in zip(lines, HOSTILE, strict=True):
        record = json.loads(line)
        assert list(record) == [
            "time",
            "event",
            "job_id",
            "restart_count",
            "reason",
            "exit_code",
            "note",
        ]
        assert (
            record["reason"] == message and record["note"] == message
        )  # not a number: kept as text
        assert record["event"] == "failed" and record["job_id"] == "4242"
        assert record["restart_count"] == 3 and record["exit_code"] == 7
        assert UTC.match(record["time"]), record["time"]


def test_batch_shell_and_python_write_the_same_shape_and_clock(tmp_path: Path) -> None:
    proc = run_shell(tmp_path, "hpctrain_event signal signal USR2", {"TZ": "America/New_York"})
    assert proc.returncode == 0, proc.stderr
    RunFolder(tmp_path).event("preempted", step=5, source="train_entry")
    shell, py = (json.loads(x) for x in (tmp_path / layout.EVENTS).read_text().splitlines())
    assert list(shell)[:2] == list(py)[:2] == ["time", "event"]
    assert UTC.match(shell["time"]) and UTC.match(py["time"])  # UTC even with a local TZ set
    assert abs(int(shell["time"][11:13]) - int(utc_now()[11:13])) in (0, 1, 23)
    assert py == {"time": py["time"], "event": "preempted", "step": 5, "source": "train_entry"}
    assert TIME_FORMAT == "%Y-%m-%dT%H:%M:%SZ"


def test_restarts_line_from_the_template_is_json(tmp_path: Path) -> None:
    text = (REPO / "tests" / "golden" / "local.sh").read_text()
    start = text.rindex("  hpctrain_now\n", 0, text.index('/restarts.jsonl"'))
    line = "\n".join(text[start:].splitlines()[:3])
    proc = run_shell(tmp_path, line, {"HOSTNAME": 'h"o\\st'})
    assert proc.returncode == 0, proc.stderr
    (record,) = [json.loads(x) for x in (tmp_path / layout.RESTARTS).read_text().splitlines()]
    assert (
        record["host"] == 'h"o\\st' and record["restart_count"] == 3 and record["job_id"] == "4242"
    )


def test_atomic_write_replaces_whole_files_and_leaves_no_temporaries(tmp_path: Path) -> None:
    run = RunFolder(tmp_path / "run")
    run.write(layout.JOB_SH, "#!/bin/bash\n", mode=0o755)
    run.write(layout.JOB_SH, "#!/bin/bash\necho new\n", mode=0o755)
    assert (run.path / layout.JOB_SH).read_text() == "#!/bin/bash\necho new\n"
    assert (run.path / layout.JOB_SH).stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in run.path.iterdir()) == [layout.JOB_SH]
    target = tmp_path / "x.json"
    target.write_text("old")
    with pytest.raises(TypeError):
        write_atomic(target, 123)  # type: ignore[arg-type]
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [
        "run",
        "x.json",
    ]


def test_an_older_templates_json_fragment_is_kept_as_text(tmp_path: Path) -> None:
    """A site template written for the old helper (`hpctrain_event X '"k": "v"'`) still writes JSON."""
    proc = run_shell(tmp_path, """hpctrain_event requeue '"reason": "pre"emption"'""", {})
    assert proc.returncode == 0, proc.stderr
    (record,) = [json.loads(x) for x in (tmp_path / layout.EVENTS).read_text().splitlines()]
    assert record["event"] == "requeue" and record["extra"] == '"reason": "pre"emption"'
