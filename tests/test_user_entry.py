"""The user entry (`python -m hpctrain.launchers.entry`, what the launchers start for `--script`
and `--module`): the script runs as `python SCRIPT` would run it, and a process that would abort
in C's exit() after a finished run (torch 2.13 + gloo) leaves with the script's own status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.jobs.request import USER_ENTRY, Entry

SCRIPTS = Path(__file__).resolve().parent / "scripts"
ABORTS = SCRIPTS / "exit_abort.py"


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(SCRIPTS), *sys.path[1:]])}
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def test_the_stand_in_aborts_without_the_entry(tmp_path):
    out = _run(str(ABORTS), str(tmp_path / "out"), cwd=tmp_path)
    assert out.returncode == -6, out  # SIGABRT, as torchrun saw it: the test reproduces the fault


@pytest.mark.parametrize("code", [0, 3])
def test_a_script_ends_with_its_own_status_files_flushed_and_atexit_run(tmp_path, code):
    dest = tmp_path / "out"
    out = _run("-m", USER_ENTRY, str(ABORTS), str(dest), str(code), cwd=tmp_path)
    assert out.returncode == code, out
    assert dest.read_text() == (f"argv ['{dest}', '{code}'] path0 {SCRIPTS} name __main__\n"), (
        "the script's view differs from `python SCRIPT`'s, or its open file was not flushed"
    )
    assert (tmp_path / "out.atexit").read_text() == "ran\n"


def test_a_module_runs_as_main(tmp_path):
    dest = tmp_path / "out"
    out = _run("-m", USER_ENTRY, "-m", "exit_abort", str(dest), cwd=tmp_path)
    assert out.returncode == 0, out
    assert dest.read_text() == f"argv ['{dest}'] path0 {tmp_path} name __main__\n"  # -m: the cwd


def test_an_exception_prints_the_users_traceback_and_exits_1(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("import torch\n\ndef f():\n    raise ValueError('bad value')\n\nf()\n")
    out = _run("-m", USER_ENTRY, str(script), cwd=tmp_path)
    assert out.returncode == 1
    lines = out.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):", out.stderr
    assert f'File "{script}", line 6' in lines[1] and lines[-1] == "ValueError: bad value"
    assert "runpy" not in out.stderr and "launchers" not in out.stderr


def test_script_and_module_entries_launch_through_it():
    def argv(kind: str, target: str) -> list[str]:
        return Entry(kind, target).argv(run_dir="/r", strategy="ddp", args=("--x", "1"))

    assert argv("script", "/s/t.py") == ["-m", USER_ENTRY, "/s/t.py", "--x", "1"]
    assert argv("module", "pkg.t") == ["-m", USER_ENTRY, "-m", "pkg.t", "--x", "1"]
