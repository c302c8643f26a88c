"""The SSH "site" (tests/ssh/sshd.py) and a "laptop": a separate HOME, config, state and working
folder from which hpctrain reaches the site only over SSH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sshd  # noqa: E402

VENV_PYTHON = (
    sys.executable
)  # the site's hpctrain: this checkout's venv, as a site would install it


@pytest.fixture(scope="session")
def ssh_site(tmp_path_factory):
    if not Path(sshd.SSHD).is_file():
        pytest.fail(
            "tests/ssh needs OpenSSH's server binary (not its service): "
            "apt-get install openssh-server",
            pytrace=False,
        )
    site = sshd.up(tmp_path_factory.mktemp("ssh-site"))
    yield site
    sshd.down(Path(site.dir))


class Laptop:
    """hpctrain run from a folder whose HOME, config and state are not the site's."""

    def __init__(self, root: Path, site: sshd.Site, **login: object) -> None:
        self.root, self.site = root, site
        self.home = root / "home"
        (self.home / ".ssh").mkdir(parents=True, exist_ok=True)
        # ssh reads the passwd entry's ~/.ssh, not $HOME: the profile names the laptop's
        # known_hosts
        self.known_hosts = self.home / ".ssh" / "known_hosts"
        self.known_hosts.write_text(Path(site.known_hosts).read_text())
        self.work = root / "work"
        self.work.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("SCRATCH", "XDG_RUNTIME_DIR")}
        self.env = {
            **env,
            "HOME": str(self.home),
            "XDG_STATE_HOME": str(root / "state"),
            "XDG_CONFIG_HOME": str(root / "config"),
            "OMP_NUM_THREADS": "1",
        }
        self.profile = self.write_profile("site", **login)

    def write_profile(
        self,
        name: str,
        runs_dir: str = "$SCRATCH/runs",
        extends: str = "loopback",
        extra: str = "",
        **login: object,
    ) -> Path:
        values = {
            "host": self.site.host,
            "port": self.site.port,
            "identity": self.site.identity,
            "remote_python": VENV_PYTHON,
            "workdir": f"{self.site.dir}/work",
            "known_hosts": str(self.known_hosts),
            **login,
        }
        lines = [f"name: {name}", f"extends: {extends}", "login:"]
        lines += [f"  {k}: {v!s}" for k, v in values.items() if v is not None]
        lines += ["storage:", f"  runs_dir: {runs_dir}", extra]
        path = self.root / "profiles" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        return path

    def hp(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [sys.executable, "-m", "hpctrain", *args],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if check:
            assert out.returncode == 0, (
                f"hpctrain {' '.join(args)} -> {out.returncode}\n{out.stdout}\n{out.stderr}"
            )
        return out

    def close(self) -> None:
        """Stop the login-node agent and close the control connection this laptop opened (both
        would stay for minutes)."""
        code = (
            "import sys; from hpctrain.remote.ssh import SSH, Login; "
            "from hpctrain.remote.tunnel import Tunnel; "
            "s = SSH(Login(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], "
            "known_hosts=sys.argv[5])); Tunnel(s).stop(); s.close()"
        )
        site = self.site
        subprocess.run(
            [sys.executable, "-c", code, site.host, str(site.port), site.identity, VENV_PYTHON]
            + [str(self.known_hosts)],
            env=self.env,
            capture_output=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )


@pytest.fixture
def laptop(ssh_site, tmp_path):
    lap = Laptop(tmp_path, ssh_site)
    yield lap
    lap.close()
