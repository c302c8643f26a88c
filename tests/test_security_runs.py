"""Issue 33, finding 4: a shared runs folder, and who can read a run's weights.

A runs_dir shared with a group (root's, mode 2775, no sticky bit) and a second, unprivileged account
in that group. Before: nothing checked who could write a run folder, so the member renamed root's
run folder away and put its own in its place, with a run.yaml whose frozen profile has a setup
line; root's `hpctrain resume` rendered job.sh from it and ran that line as root, and `status`
showed nothing unusual. Checkpoints followed the umask (0644): any account read the weights.
Now a run folder is 0700 (`storage.share: none`) or 0750 (`group`), the job runs under umask
077 / 027, and `resume` / `status` refuse a run folder, run.yaml, job.sh or state.json another
account could have written, in one line (exit 2) that says how to fix it.

Live: two real runs (local executor, train_entry, 2 steps, a checkpoint at the end), one per
`storage.share`, submitted at once into the shared runs_dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from _accounts import Account, other_account, shared_group

from hpctrain.kernel import jobenv

pytestmark = pytest.mark.slow

TRAIN = ["--max-steps", "2", "--model.n_layers=1"]


@dataclass
class Shared:
    base: Path  # 0755: the member can reach the runs_dir
    runs: Path  # root:group 2775, no sticky bit
    home: Path  # the victim's (root's) cwd, config and run index
    member: Account
    group: str

    def as_member(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """`argv` as the member, with the shared group (what its login shell would have)."""
        return self.member.run(argv, extra_groups=[self.group])

    def member_python(self, code: str, *args: str) -> subprocess.CompletedProcess[str]:
        return self.member.python(code, *args, extra_groups=[self.group])

    def hp(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hpctrain", *args],
            capture_output=True,
            text=True,
            env=_env(self.home),
            cwd=self.home,
            timeout=timeout,
        )


def _env(home: Path) -> dict[str, str]:
    drop = (jobenv.STOP_AT_STEP, jobenv.STOP_FILE, jobenv.RUN_DIR)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return env | {
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "OMP_NUM_THREADS": "1",
    }


@pytest.fixture(scope="module")
def shared() -> Iterator[Shared]:
    base = Path(tempfile.mkdtemp(prefix="hpctrain-shared-"))
    try:
        os.chmod(base, 0o755)
        with shared_group() as group, other_account("r", groups=[group]) as member:
            runs = base / "runs"
            runs.mkdir()
            shutil.chown(runs, "root", group)
            os.chmod(runs, 0o2775)  # group-writable, setgid, no sticky bit: members can rename
            home = base / "victim"
            home.mkdir(mode=0o700)
            s = Shared(base, runs, home, member, group)
            jobs = [  # both at once: ~10 s instead of ~20
                subprocess.Popen(
                    [sys.executable, "-m", "hpctrain", "submit", "--profile", "local"]
                    + ["--nodes", "1", "--gpus", "1", "--name", name, "--wait"]
                    + ["--set", f"storage.runs_dir={runs}", *extra, "--", *TRAIN],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=_env(home),
                    cwd=home,
                )
                for name, extra in (("mine", []), ("ours", ["--set", "storage.share=group"]))
            ]
            for job in jobs:
                out, _ = job.communicate(timeout=300)
                assert job.returncode == 0, out
            yield s
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _weights(run: Path) -> list[Path]:
    found = sorted(p for p in (run / "checkpoints").rglob("*") if p.is_file())
    assert any(p.name.endswith(".raw") for p in found), found
    return found


def test_a_private_runs_checkpoints_are_yours_alone(shared: Shared) -> None:
    run = shared.runs / "mine"
    assert stat.S_IMODE(run.stat().st_mode) & 0o777 == 0o700
    for p in [run / "checkpoints", *(run / "checkpoints").rglob("*")]:
        assert p.stat().st_mode & 0o077 == 0, (p, oct(p.stat().st_mode))
    for p in [run / "run.yaml", run / "job.sh", run / "logs", run / "logs" / "rank-0.log"]:
        assert p.stat().st_mode & 0o077 == 0, (p, oct(p.stat().st_mode))
    weights = next(p for p in _weights(run) if p.suffix == ".raw")
    read = shared.as_member(["cat", str(weights)])
    assert read.returncode != 0 and "Permission denied" in read.stderr, read


def test_a_group_shared_runs_checkpoints_are_group_readable_never_writable(shared: Shared) -> None:
    run = shared.runs / "ours"
    assert run.stat().st_mode & 0o777 == 0o750
    for p in [run, *run.rglob("*")]:
        mode = p.lstat().st_mode
        assert mode & 0o022 == 0, (p, oct(mode))  # never group- or world-writable
    for p in _weights(run):
        mode = p.stat().st_mode
        assert mode & 0o007 == 0 and mode & 0o040 and not mode & 0o020, (p, oct(mode))
    weights = next(p for p in _weights(run) if p.suffix == ".raw")
    read = shared.as_member(["sha256sum", str(weights)])
    assert read.returncode == 0, read
    assert read.stdout.split()[0] == hashlib.sha256(weights.read_bytes()).hexdigest()
    write = shared.member_python(f"open({str(weights)!r}, 'ab')")
    assert write.returncode != 0 and "PermissionError" in write.stderr, write


def test_a_run_folder_swapped_by_a_group_member_is_refused(shared: Shared) -> None:
    run, marker = shared.runs / "mine", shared.base / "ran-as-root"
    # what the member plants: a run.yaml like any hpctrain submit writes (the member could make
    # one with its own run), whose frozen profile runs a command of its choosing
    frozen = yaml.safe_load((run / "run.yaml").read_text())
    frozen["profile"]["environment"]["setup"] = [f"touch {marker}"]
    planted = shared.member.home / "planted"
    planted.mkdir()
    (planted / "run.yaml").write_text(yaml.safe_dump(frozen))
    (planted / "state.json").write_text(json.dumps({"state": "FAILED", "exit_code": 1}) + "\n")
    (planted / "job.sh").write_text(f"#!/bin/bash\ntouch {marker}\n")
    for p in [planted, *planted.iterdir()]:
        os.chown(p, shared.member.uid, shared.member.gid)
    swap = shared.member_python(
        "import os, shutil, sys\n"
        "run, planted = sys.argv[1], sys.argv[2]\n"
        "os.rename(run, run + '.gone')\n"  # the runs_dir is group-writable: any member may rename
        "shutil.copytree(planted, run)\n",
        str(run),
        str(planted),
    )
    assert swap.returncode == 0, swap.stderr
    try:
        assert run.stat().st_uid == shared.member.uid  # the folder root finds by name is theirs
        out = shared.hp("resume", "mine", "--max-steps", "4")
        assert out.returncode == 2, out.stdout + out.stderr
        line = out.stderr.strip()
        assert len(line.splitlines()) == 1 and "Traceback" not in line, line
        assert f"owned by uid {shared.member.uid}" in line and "not yours" in line, line
        assert "move it away" in line and f"chmod +t {shared.runs}" in line, line
        assert not marker.exists()
        status = shared.hp("status", "mine")
        assert status.returncode == 2 and "not safe" in status.stderr, status
        assert len(status.stderr.strip().splitlines()) == 1, status.stderr
        listing = shared.hp("status")  # every run: the swapped one is a row saying why
        assert listing.returncode == 0 and "mine: broken: run folder not safe" in listing.stdout
        assert not marker.exists()
    finally:  # root puts its own run folder back
        shutil.rmtree(run)
        os.rename(f"{run}.gone", run)
    assert shared.hp("status", "mine").returncode == 0


def test_a_writable_or_linked_run_yaml_is_refused_with_the_fix(shared: Shared) -> None:
    run = shared.runs / "ours"
    for name in ("run.yaml", "job.sh"):
        target = run / name
        mode = target.stat().st_mode
        os.chmod(target, mode | 0o020)
        try:
            for cmd in (["status", "ours"], ["resume", "ours", "--dry-run"]):
                out = shared.hp(*cmd)
                assert out.returncode == 2, out
                assert f"chmod go-w {target}" in out.stderr and "group-writable" in out.stderr
        finally:
            os.chmod(target, mode)
    real = run / "run.yaml"
    aside = run / "run.yaml.real"
    os.rename(real, aside)
    real.symlink_to(aside)
    try:
        out = shared.hp("status", "ours")
        assert out.returncode == 2 and f"{real} is a symlink" in out.stderr, out
    finally:
        real.unlink()
        os.rename(aside, real)
    assert shared.hp("status", "ours").returncode == 0


def test_a_user_private_group_may_write(tmp_path):
    """umask 002 under the user-private-group scheme (RHEL, Debian): the group named as you, with
    no other member, lets nobody else in; a group with a member does."""
    import grp
    import pwd

    from hpctrain.kernel.rundir import RunFolder

    me = pwd.getpwuid(os.geteuid())
    run = tmp_path / "r"
    run.mkdir(mode=0o775)
    (run / "run.yaml").write_text("{}\n")
    os.chmod(run / "run.yaml", 0o664)
    own = grp.getgrnam(me.pw_name) if me.pw_name in {g.gr_name for g in grp.getgrall()} else None
    if own is None or set(own.gr_mem) - {me.pw_name}:
        pytest.fail(f"{me.pw_name} has no private group here: the suite runs as root in CI")
    os.chown(run, -1, own.gr_gid)
    os.chown(run / "run.yaml", -1, own.gr_gid)
    assert RunFolder(run).unsafe() is None
    with shared_group("u") as group, other_account("u", groups=[group]):
        os.chown(run / "run.yaml", -1, grp.getgrnam(group).gr_gid)
        assert "group-writable" in (RunFolder(run).unsafe() or "")
