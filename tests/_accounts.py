"""A second, unprivileged local account for the security tests (issue 33): the attacker on a shared
node. The suite runs as root in CI, which may `useradd`; every account made here is removed with
`userdel` when its block ends, whatever happens. `other_account()` fails (never skips) in CI when it
cannot make one."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
REPO = Path(__file__).resolve().parent.parent


def _site_packages() -> list[str]:
    return [p for p in sys.path if p.endswith("site-packages")]


def _python() -> str:
    """An interpreter of this version that any account can run."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for where in (f"/usr/bin/{version}", f"/usr/local/bin/{version}", sys.executable):
        if os.access(where, os.X_OK):
            return where
    return sys.executable


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: Path  # a folder of its own (0700, owned by it) for what it plants or keeps

    def run(
        self, argv: Sequence[str], *, timeout: float = 120, **kw: object
    ) -> subprocess.CompletedProcess[str]:
        """`argv` as this account (no supplementary groups unless `extra_groups`), from its home."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home)}
        env.update(kw.pop("env", None) or {})  # type: ignore[call-overload]
        kw.setdefault("cwd", str(self.home))
        kw.setdefault("extra_groups", [])
        return subprocess.run(  # type: ignore[call-overload,no-any-return]
            list(argv),
            user=self.uid,
            group=self.gid,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            **kw,
        )

    def python(self, code: str, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        """`code` as this account, with this checkout's packages (torch, hpctrain) importable. The
        venv's interpreter may lie under root's 0700 home (pyenv), so the system's Python of the
        same version runs it, the venv's site-packages and the checkout on its path."""
        env = {"PYTHONPATH": os.pathsep.join([str(REPO), *_site_packages()])}
        env.update(kw.pop("env", None) or {})  # type: ignore[call-overload]
        return self.run([_python(), "-c", code, *args], env=env, **kw)


def _unavailable(why: str) -> None:
    if IN_CI:
        pytest.fail(f"a second account is needed in CI: {why}")
    pytest.skip(why)


@contextlib.contextmanager
def other_account(tag: str = "x", groups: Sequence[str] = ()) -> Iterator[Account]:
    """A fresh unprivileged account (`hpct<tag><pid>`), removed at the end."""
    if os.geteuid() != 0:
        _unavailable("making a second account needs root (useradd)")
    name = f"hpct{tag}{os.getpid()}"[:31]
    made = subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group", name]
        + (["--groups", ",".join(groups)] if groups else []),
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        _unavailable(f"useradd {name}: {made.stderr.strip()}")
    home = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    try:
        out = subprocess.run(["id", "-u", name], capture_output=True, text=True, check=True)
        uid = int(out.stdout)
        gid = int(subprocess.run(["id", "-g", name], capture_output=True, text=True).stdout)
        os.chown(home, uid, gid)
        os.chmod(home, 0o700)
        yield Account(name, uid, gid, home)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)
        subprocess.run(["rm", "-rf", str(home)], capture_output=True)


@contextlib.contextmanager
def shared_group(tag: str = "g") -> Iterator[str]:
    """A fresh group (for a group-writable runs folder), removed at the end."""
    if os.geteuid() != 0:
        _unavailable("making a group needs root (groupadd)")
    name = f"hpcg{tag}{os.getpid()}"[:31]
    made = subprocess.run(["groupadd", name], capture_output=True, text=True)
    if made.returncode != 0:
        _unavailable(f"groupadd {name}: {made.stderr.strip()}")
    try:
        yield name
    finally:
        subprocess.run(["groupdel", name], capture_output=True)
