"""hpctrain on a remote site: its commands run on the login node, with the site's Python, the site's
environment ($SCRATCH, modules...) and the site's Slurm. Run folders, the scheduler and the run
index stay on the site; this machine only keeps a pointer (index.py)."""

from __future__ import annotations

import io
import json
import shlex
import sys

from hpctrain.remote.ssh import SSH, Login, RemoteError, check_started, remote_word
from hpctrain.remote.tunnel import Tunnel

# Expand one profile path ($VAR, ~) the way the site's shell would, without running a shell on it.
_EXPAND = (
    "import json, os, sys; print(json.dumps([os.path.abspath(os.path.expanduser("
    "os.path.expandvars(p))) for p in sys.argv[1:]]))"
)


class Site:
    def __init__(self, login: Login) -> None:
        self.login = login
        self.ssh = SSH(login)
        self.tunnel = Tunnel(self.ssh)

    @property
    def python(self) -> str:
        return remote_word(self.login.remote_python)

    def command(self, args: list[str]) -> str:
        return f"{self.python} -m hpctrain {shlex.join(args)}"

    def hpctrain(self, args: list[str]) -> int:
        """`hpctrain ARGS` on the site, output live here; returns its exit code. Through the
        login-node agent when it is up (tunnel.py), else one ssh command."""
        rc = self.tunnel.run(args, sys.stdout.buffer, sys.stderr.buffer)
        if rc is not None:
            return rc
        rc, tail = self.ssh.stream(self.command(args))
        self._check_started(rc, tail)
        return rc

    def hpctrain_json(self, args: list[str]) -> object:
        """`hpctrain ARGS` (a --json command) on the site; its parsed output."""
        out, err_buf = io.BytesIO(), io.BytesIO()
        rc = self.tunnel.run(args, out, err_buf)
        if rc is not None:
            stdout, err = out.getvalue(), err_buf.getvalue().decode(errors="replace")
        else:
            proc = self.ssh.run(self.command(args), check=True)
            rc, stdout, err = proc.returncode, proc.stdout, proc.stderr.decode(errors="replace")
            self._check_started(rc, err)
        if rc != 0:
            raise RemoteError(
                f"{self.login.where}: hpctrain {args[0]} failed: "
                f"{err.strip().splitlines()[-1] if err.strip() else rc}"
            )
        got: object = json.loads(stdout.decode())
        return got

    def _check_started(self, rc: int, stderr: str) -> None:
        check_started(self.login, rc, stderr)

    def expand(self, *paths: str) -> list[str]:
        """Absolute paths with the site's $VARS and ~ expanded on the login node. A variable that is
        not set there stays as `$NAME` in the result, which the caller refuses."""
        cmd = f"{self.python} -c {shlex.quote(_EXPAND)} {shlex.join(paths)}"
        proc = self.ssh.run(cmd)
        err = proc.stderr.decode(errors="replace")
        self._check_started(proc.returncode, err)
        if proc.returncode != 0:
            raise RemoteError(
                f"{self.login.where}: cannot resolve {', '.join(paths)}: {err.strip()}"
            )
        return list(json.loads(proc.stdout.decode()))

    def probe(self) -> dict[str, str]:
        """What `doctor` reports about the site before any job: Python, hpctrain, Slurm commands."""
        script = (
            f'py={self.python}; printf \'python=%s\\n\' "$(command -v "$py" || echo missing)"; '
            '"$py" -c \'import hpctrain, sys; print("hpctrain=" + hpctrain.__version__); '
            'print("python_version=" + sys.version.split()[0])\' 2>/dev/null '
            "|| echo hpctrain=missing; "
            "for c in sbatch squeue sacct scancel scontrol; do "
            'printf \'%s=%s\\n\' "$c" "$(command -v $c || echo missing)"; done'
        )
        proc = self.ssh.run(script)
        out: dict[str, str] = {}
        for line in proc.stdout.decode(errors="replace").splitlines():
            key, sep, value = line.partition("=")
            if sep:
                out[key] = value
        return out
