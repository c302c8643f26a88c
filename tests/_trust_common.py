"""Helpers shared by tests/test_trust.py and tests/test_trust_policy.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctrain.cli import main
from hpctrain.jobs.request import JobRequest
from hpctrain.jobs.spec import JobSpec
from hpctrain.kernel import jobenv
from hpctrain.profiles import resolve
from hpctrain.render.script import render


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    return path


def cli(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert "Traceback" not in result.output, result.output
    if result.exit_code not in (0, 2):
        raise AssertionError(f"exit {result.exit_code}: {result.output}\n{result.exception!r}")
    return result


def site_template(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, files: dict[str, str] | None = None
) -> Path:
    site = tmp_path / "site"
    write(site / "templates" / "sbatch.sh.j2", '{% extends "hpctrain/sbatch.sh.j2" %}\n' + body)
    for name, text in (files or {}).items():
        write(site / "templates" / name, text)
    monkeypatch.setenv(jobenv.SITE_PATH, str(site))
    return site


def render_local(**flags: object) -> str:
    profile = resolve("local", dict(flags))
    req = JobRequest.build(profile, name="t", nodes=1)
    return render(JobSpec.build(profile, req, "/tmp/runs/t"))
