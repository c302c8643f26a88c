"""The live-test rules of tests/conftest.py, checked without a cluster: outside CI a non-root user
gets a skip that says how to run the live tests; with CI=true the same situation, or any skip at
all, is a failure."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.kernel import jobenv

CONFTEST = Path(__file__).with_name("conftest.py")

LIVE_TESTS = """
import pytest

@pytest.mark.slurm
def test_uses_the_cluster(slurm_cluster):
    pass

@pytest.mark.slurm
def test_skips_by_itself():
    pytest.skip("some reason")

def test_not_live():
    pytest.skip("not a slurm test: may skip")
"""


def _run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    # A copy of the real conftest in a folder with no cluster.sh beside it: the cluster is "not up".
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_live.py").write_text(LIVE_TESTS)
    (tmp_path / "notroot.py").write_text("import os\nos.geteuid = lambda: 1000\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slurm: live\n")
    # not CI, and not the outer run's test log (the inner run's tests are not this suite's)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", jobenv.TEST_LOG)}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(tmp_path)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "notroot",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rA",
            "test_live.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_outside_ci_without_root_live_tests_skip_saying_how_to_run(tmp_path):
    out = _run(tmp_path, ci=None)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 skipped" in out.stdout, out.stdout
    assert "sudo make test-slurm" in out.stdout


@pytest.mark.parametrize("ci", ["true", "TRUE"])
def test_in_ci_a_missing_cluster_or_a_skip_fails(tmp_path, ci):
    out = _run(tmp_path, ci=ci)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "ERROR test_live.py::test_uses_the_cluster" in out.stdout
    assert "CI=true: live Slurm tests must run" in out.stdout
    assert "FAILED test_live.py::test_skips_by_itself" in out.stdout
    assert "skipped under CI=true (not allowed)" in out.stdout
    assert "FAILED test_live.py::test_not_live" in out.stdout  # no test may skip in CI
    assert "test skipped under CI=true (not allowed)" in out.stdout
