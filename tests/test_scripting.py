"""Scripting and consistency (issue 34): `submit --json`, shell completion of run and profile
names, one message for `gpus_per_node: eight`, and `--strategy` rendered once. Fast: a stand-in
sbatch/sacct/scontrol at the subprocess boundary (as tests/test_cli_jobs.py), no job runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctrain.cli import main
from hpctrain.kernel import jobenv

HPCTRAIN = [sys.executable, "-m", "hpctrain"]


@pytest.fixture
def site(tmp_path):
    """A stand-in Slurm on PATH: sbatch says job 77; sacct and scontrol say $RECORD/state."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    scripts = {
        "sbatch": 'echo "Submitted batch job 77"',
        "sacct": 'printf "JobID|State|NodeList\\n77|%s|n1\\n" "$(cat "$RECORD/state")"',
        "scontrol": 'echo "JobId=77 JobName=s JobState=$(cat "$RECORD/state")"',
    }
    for name, body in scripts.items():
        (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    (tmp_path / "state").write_text("COMPLETED")
    env = {
        **os.environ,
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "RECORD": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_STATE_HOME": str(tmp_path / "state-home"),
        jobenv.PYTHON: "/opt/py/bin/python",
    }
    env.pop(jobenv.SITE_PATH, None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*HPCTRAIN, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    return run


OPTS = ["--profile", "loopback", "--nodes", "1", "--gpus", "2", "--name", "s", "--time", "5"]


def test_submit_json_is_one_object_on_stdout(site, tmp_path):
    out = site("submit", *OPTS, "--json", "--", "--max-steps", "5")
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out.stdout)  # stdout holds the object and nothing else
    assert got["name"] == "s" and got["job_id"] == "77" and got["job_ids"] == ["77"]
    assert got["run_dir"] == str(tmp_path / "runs" / "s") and got["profile"] == "loopback"
    assert got["scheduler"] == "slurm" and got["total_steps"] == 5 and got["dry_run"] is False
    assert "state" not in got and "submitted s: job 77" in out.stderr  # the text: on stderr


def test_submit_json_wait_adds_the_final_state(site, tmp_path):
    out = site("submit", *OPTS, "--json", "--wait", "--", "--max-steps", "5")
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out.stdout)
    assert got["job_id"] == "77" and got["state"] == "COMPLETED" and got["why"] is None
    assert "progress" in got


def test_submit_json_wait_exits_1_with_the_failure(site, tmp_path):
    (tmp_path / "state").write_text("FAILED")
    out = site("submit", *OPTS, "--json", "--wait", "--", "--max-steps", "5")
    assert out.returncode == 1, out.stdout + out.stderr
    assert json.loads(out.stdout)["state"] == "FAILED"


def test_submit_json_dry_run(site, tmp_path):
    out = site("submit", *OPTS, "--json", "--dry-run")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["dry_run"] is True and got["job_id"] is None and got["job_ids"] == []
    assert "nothing was written" in out.stderr and not (tmp_path / "runs" / "s").exists()


def test_submit_help_documents_the_json_keys():
    res = CliRunner().invoke(main, ["submit", "--help"])
    for key in ("run_dir", "job_id", "job_ids", "scheduler", "state", "progress", "why"):
        assert key in res.output, key
    assert "jq -r .job_id" in res.output


# ---------------------------------------------------------------- shell completion
def complete(tmp_path: Path, monkeypatch, words: str) -> list[str]:
    """What bash completion offers for the last word of `words` (click's own machinery)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    env = {
        "_HPCTRAIN_COMPLETE": "bash_complete",
        "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
    }
    res = CliRunner().invoke(main, [], prog_name="hpctrain", env=env)
    assert res.exit_code == 0, res.output
    return [line.split(",", 1)[1] for line in res.output.splitlines() if line]


@pytest.fixture
def runs(tmp_path):
    for name in ("gpt-small", "gpt-large", "other"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "run.yaml").write_text("{}\n")
    return tmp_path


@pytest.mark.parametrize(
    "command", ["status", "logs", "resume", "cancel", "preempt", "report", "export"]
)
def test_run_names_complete(runs, monkeypatch, command):
    assert complete(runs, monkeypatch, f"hpctrain {command} gpt") == ["gpt-large", "gpt-small"]


def test_run_names_complete_from_runs_dir(tmp_path, monkeypatch):
    (tmp_path / "elsewhere" / "far-run").mkdir(parents=True)
    (tmp_path / "elsewhere" / "far-run" / "run.yaml").write_text("{}\n")
    words = f"hpctrain status --runs-dir {tmp_path / 'elsewhere'} f"
    assert complete(tmp_path, monkeypatch, words) == ["far-run"]


def test_profile_names_complete(tmp_path, monkeypatch):
    mine = tmp_path / "config" / "hpctrain" / "profiles"
    mine.mkdir(parents=True)
    (mine / "lovelace.yaml").write_text("name: lovelace\nscheduler: local\n")
    got = complete(tmp_path, monkeypatch, "hpctrain submit --profile lo")
    assert got == ["local", "loopback", "lovelace"]
    assert complete(tmp_path, monkeypatch, "hpctrain doctor --profile loc") == ["local"]
    assert complete(tmp_path, monkeypatch, "hpctrain plan --profile loc") == ["local"]
    assert complete(tmp_path, monkeypatch, "hpctrain profiles show loo") == ["loopback"]


# ---------------------------------------------------------------- one message, one flag
def test_a_word_for_a_number_is_one_located_message(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path = tmp_path / "p.yaml"
    path.write_text("name: p\nscheduler: local\nslurm:\n  gpus_per_node: eight\n")
    res = CliRunner().invoke(main, ["render", "--profile", str(path), "--name", "x"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "1 problem found" in res.output and "quoted" not in res.output, res.output
    assert (
        f"{path}:4: slurm.gpus_per_node: 'eight' is not a whole number; "
        "fix: write a whole number, e.g. `gpus_per_node: 8`" in res.output
    )


def test_the_entry_gets_strategy_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for args in (
        ["--", "--strategy", "fsdp", "--max-steps", "3"],
        ["--", "--strategy=fsdp", "--max-steps", "3"],
        ["--strategy", "fsdp", "--", "--strategy", "fsdp", "--max-steps", "3"],
    ):
        res = CliRunner().invoke(main, ["render", "--profile", "local", "--name", "d", *args])
        assert res.exit_code == 0, res.output
        (entry,) = [line for line in res.output.splitlines() if line.startswith("hpctrain_entry=")]
        assert entry.count("--strategy") == 1 and "--strategy fsdp --max-steps 3" in entry, entry
