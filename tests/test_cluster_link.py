"""tests/slurm/cluster.sh and the one /etc/slurm/slurm.conf link: `up` may point it at its own state
folder only when there is no link, it is stale, it points here already, or its cluster is not
running. Tested through `cluster.sh check-link` (the same function `up` runs first) with the link
in a temporary folder (jobenv.SLURM_SYS_CONF), so the shared live cluster is never touched."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hpctrain.kernel import jobenv

CLUSTER_SH = Path(__file__).resolve().parent / "slurm" / "cluster.sh"
HEADER = "# Written by tests/slurm/cluster.sh: a two-node test cluster on loopback.\n"


def state(root: Path, name: str) -> Path:
    """A state folder as `up` leaves it: etc/slurm.conf written by the script, run/ for pid files."""
    s = root / name
    (s / "etc").mkdir(parents=True)
    (s / "run").mkdir()
    (s / "etc" / "slurm.conf").write_text(HEADER + "ClusterName=hpctrain\n")
    return s


def check(link: Path, mine: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, jobenv.SLURM_STATE: str(mine), jobenv.SLURM_SYS_CONF: str(link)}
    return subprocess.run(
        ["bash", str(CLUSTER_SH), "check-link"], env=env, capture_output=True, text=True
    )


@pytest.fixture
def daemon(tmp_path):
    """A running process whose command name is slurmctld (a copy of sleep), as a live cluster's."""
    exe = tmp_path / "bin" / "slurmctld"
    exe.parent.mkdir()
    shutil.copy(shutil.which("sleep"), exe)
    proc = subprocess.Popen([str(exe), "300"])
    yield proc
    proc.kill()
    proc.wait()


def test_up_refuses_a_link_to_another_running_cluster_and_allows_dead_or_stale(tmp_path, daemon):
    mine, other = state(tmp_path, "mine"), state(tmp_path, "other")
    link = tmp_path / "etc-slurm" / "slurm.conf"
    link.parent.mkdir()

    assert check(link, mine).returncode == 0  # no link yet
    link.symlink_to(mine / "etc" / "slurm.conf")
    assert check(link, mine).returncode == 0  # already ours

    link.unlink()
    link.symlink_to(other / "etc" / "slurm.conf")
    (other / "run" / "slurmctld.pid").write_text(f"{daemon.pid}\n")
    out = check(link, mine)
    assert out.returncode == 2, out
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert f"points to {other}, whose test cluster is running" in out.stderr
    assert f"export {jobenv.SLURM_STATE}={other}" in out.stderr
    assert link.readlink() == other / "etc" / "slurm.conf"  # nothing changed
    assert not (mine / "log").exists()

    daemon.kill()
    daemon.wait()  # its pid file stays behind: a dead cluster
    assert check(link, mine).returncode == 0

    shutil.rmtree(other)  # a stale link
    assert check(link, mine).returncode == 0

    foreign = tmp_path / "site.conf"
    foreign.write_text("ClusterName=real\n")
    link.unlink()
    link.symlink_to(foreign)
    out = check(link, mine)
    assert out.returncode == 2 and "which this script did not write" in out.stderr, out


def test_down_removes_only_the_link_it_created(tmp_path):
    """`down` on a state folder with no daemon of its own stops nothing and removes the link only
    when it points into that folder."""
    mine, other = state(tmp_path, "mine"), state(tmp_path, "other")
    link = tmp_path / "etc-slurm" / "slurm.conf"
    link.parent.mkdir()
    env = {**os.environ, jobenv.SLURM_STATE: str(mine), jobenv.SLURM_SYS_CONF: str(link)}

    def down() -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(CLUSTER_SH), "down"], env=env, capture_output=True, text=True, timeout=60
        )

    link.symlink_to(other / "etc" / "slurm.conf")
    out = down()
    assert out.returncode == 0 and link.is_symlink(), out  # another cluster's link stays
    link.unlink()
    link.symlink_to(mine / "etc" / "slurm.conf")
    out = down()
    assert out.returncode == 0, out
    if os.geteuid() == 0:
        assert not link.is_symlink() and f"removed {link}" in out.stdout, out
    else:  # without root `down` touches nothing (it says so)
        assert link.is_symlink() and "nothing of ours is running" in out.stdout, out
