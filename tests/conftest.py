"""Shared fixtures. The live Slurm cluster (tests/slurm/cluster.sh) is here: `slurm_cluster`.

Live tests are marked `@pytest.mark.slurm` and take the `slurm_cluster` fixture. `make test` and
`make test-slurm` start the cluster first and stop it after. Run alone as root, the fixture starts
it itself and stops it at the end of the session. With CI=true a cluster that is not up fails the
test, and any skipped test is reported as a failure: in CI nothing skips, live tests included.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from hpctrain.kernel import jobenv

REPO = Path(__file__).resolve().parent.parent
CLUSTER_SH = REPO / "tests" / "slurm" / "cluster.sh"
IN_CI = os.environ.get("CI", "").lower() == "true"
HOW_TO_RUN = "run the live Slurm tests as root: sudo make test-slurm"

# Runs are indexed in $XDG_STATE_HOME/hpctrain/runs.jsonl: keep the tests' runs out of the user's own
# index (subprocesses inherit this).
os.environ["XDG_STATE_HOME"] = os.environ.get(jobenv.TEST_STATE) or str(
    Path(os.environ.get("TMPDIR", "/tmp")) / f"hpctrain-test-state-{os.getpid()}"
)
# ... and the validated-profile cache (hpctrain/profiles/cache.py) out of the user's ~/.cache.
os.environ["XDG_CACHE_HOME"] = str(Path(os.environ["XDG_STATE_HOME"]) / "cache")


def _cluster(cmd: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), cmd], capture_output=True, text=True, timeout=timeout
    )


class SlurmCluster:
    """The running loopback cluster: submit raw sbatch scripts and watch jobs (tests of the cluster
    itself; the end-to-end tests go through the hpctrain CLI instead)."""

    nodes = ("n1", "n2")
    gpus_per_node = 2
    partition = "debug"

    def sbatch(self, script: str, workdir: Path, *args: str) -> str:
        path = workdir / f"job-{time.monotonic_ns()}.sh"
        path.write_text(script)
        out = subprocess.run(
            ["sbatch", "--parsable", f"--chdir={workdir}", *args, str(path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, f"sbatch failed: {out.stderr}"
        return out.stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        """The job's state as the controller sees it (scontrol keeps ended jobs MinJobAge s)."""
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30
        )
        m = re.search(r"JobState=(\S+)", out.stdout)
        return m.group(1) if m else "UNKNOWN"

    def wait_state(self, job_id: str, states: set[str], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.5)
        raise AssertionError(
            f"job {job_id} not in {sorted(states)} after {timeout} s: {self.job_state(job_id)}"
        )

    def wait_done(self, job_id: str, timeout: float = 60) -> str:
        return self.wait_state(
            job_id,
            {
                "COMPLETED",
                "FAILED",
                "CANCELLED",
                "TIMEOUT",
                "NODE_FAIL",
                "OUT_OF_MEMORY",
                "BOOT_FAIL",
                "DEADLINE",
            },
            timeout,
        )

    def sacct(self, job_id: str, timeout: float = 30) -> list[dict[str, str]]:
        """Accounting rows for the allocation (-X), every attempt (-D), once slurmdbd has them."""
        fields = ["JobID", "State", "ExitCode", "NodeList", "AllocTRES"]
        deadline = time.monotonic() + timeout
        rows: list[dict[str, str]] = []
        while time.monotonic() < deadline:
            out = subprocess.run(
                ["sacct", "-X", "-D", "-n", "-P", "-j", job_id, "-o", ",".join(fields)],
                capture_output=True,
                text=True,
                timeout=30,
            )
            rows = [
                dict(zip(fields, line.split("|"), strict=False))
                for line in out.stdout.splitlines()
                if line
            ]
            if rows and not any(r["State"] in ("PENDING", "RUNNING") for r in rows):
                return rows
            time.sleep(0.5)
        return rows


def _cluster_is_up() -> bool:
    try:
        return _cluster("status", 30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def slurm_cluster():
    """The live loopback Slurm cluster, started here when it is not up and we are root."""
    started = False
    if not _cluster_is_up():
        if os.geteuid() != 0:
            msg = f"the loopback Slurm cluster is not running and this is not root; {HOW_TO_RUN}"
            if IN_CI:
                pytest.fail(msg + " (CI=true: live Slurm tests must run)", pytrace=False)
            pytest.skip(msg)
        up = _cluster("up", 600)
        if up.returncode != 0:
            pytest.fail(
                f"tests/slurm/cluster.sh up failed:\n{up.stdout}\n{up.stderr}", pytrace=False
            )
        started = True
    yield SlurmCluster()
    if started:
        _cluster("down", 120)


@functools.cache  # xdist asks once per test id
def _live(file: str) -> bool:
    """A test file that meets the one live cluster: a slurm-marked test, the sshd of tests/ssh/,
    or test_cluster_link (it points the cluster's link)."""
    path = REPO / file
    if "ssh" in path.parts or path.stem == "test_cluster_link":
        return True
    try:
        return "mark.slurm" in path.read_text()
    except OSError:
        return False


@pytest.hookimpl(optionalhook=True)  # the compatibility lane's venv has no pytest-xdist
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (`make test` runs `-n 2`): every live test file in one scope, in order on
    one worker, so two live jobs never wait behind each other on the cluster's two nodes; any other
    file is a scope of its own (its module fixtures, reference runs, are built once; xdist's
    `--dist loadgroup` set each of them up twice)."""
    from xdist.scheduler import LoadScopeScheduling

    class LiveInOrder(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "live" if _live(file) else file

    return LiveInOrder(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """CI rule: a test that skips is a failure, whatever made it skip (a skip would count as a pass
    in a green run). Also keeps each
    phase's report on the item (item.rep_call) so fixtures can print logs when a test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        kind = "live Slurm test" if item.get_closest_marker("slurm") is not None else "test"
        report.longrepr = f"{kind} skipped under CI=true (not allowed): {report.longrepr}"


def pytest_runtest_logreport(report):
    """jobenv.TEST_LOG=PATH: one line per test phase as it ends (outcome, seconds, id), so a long
    run can be read while it goes and timeouts sized from what it measured."""
    path = os.environ.get(jobenv.TEST_LOG)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the controller writes what every worker reports
        return
    if path and (report.when == "call" or report.outcome != "passed" or report.duration > 5):
        with open(path, "a") as f:
            f.write(f"{report.outcome:7} {report.duration:8.1f} {report.when:8} {report.nodeid}\n")
