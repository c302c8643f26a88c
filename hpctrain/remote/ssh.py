"""The SSH transport: the system's OpenSSH client, one control connection per site.

Every command to a site goes through `ssh` with `ControlMaster=auto`, a `ControlPath` in a private
folder (0700) and `ControlPersist`: the first command opens the connection (and asks for a password,
a key passphrase or an MFA code once, in the terminal, if the site wants one); every later command,
`rsync` and `scp` included, reuses it until it has been idle for `PERSIST_S`. hpctrain never sees
or stores a password. Host keys are checked strictly against known_hosts: a site whose key is not
known is refused with the command that shows its fingerprint. Without a terminal (scripts, CI) ssh
runs in BatchMode, so a missing key fails at once instead of waiting for a prompt.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpctrain.kernel.errors import UserError
from hpctrain.profiles.schema.login import Login as LoginSection

PERSIST_S = 600  # an idle control connection closes after 10 minutes
CONNECT_TIMEOUT_S = 15
SSH_FAILED = 255  # ssh's own exit code for a connection or authentication failure


class RemoteError(UserError):
    """The site could not be reached or refused: one line naming the host and the fix."""


FIELDS = ("host", "port", "identity", "remote_python", "workdir", "known_hosts", "agent")


@dataclass(frozen=True)
class Login:
    """Where a site is: the profile's `login:` section (or the run index's copy of it)."""

    host: str
    port: int | None = None
    identity: str | None = None
    remote_python: str = "python3"
    workdir: str = "~/.hpctrain"
    known_hosts: str | None = None
    agent: bool = True  # reach the site's hpctrain through the login-node agent (tunnel.py)

    @classmethod
    def of(cls, value: Mapping[str, object] | LoginSection) -> Login:
        """From the profile's section or the run index's JSON copy of it (checked as the section
        is; keys of another hpctrain's version left out)."""
        if isinstance(value, Mapping):
            known = {k: v for k, v in value.items() if k in FIELDS and v is not None}
            value = LoginSection.model_validate(known)
        return cls(
            host=value.host,
            port=value.port,
            identity=value.identity,
            remote_python=value.remote_python,
            workdir=value.workdir,
            known_hosts=value.known_hosts,
            agent=value.agent,
        )

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in FIELDS}

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}" if self.port else self.host


TMP = "/tmp"  # the fallback's parent (a test points it elsewhere)


def control_dir() -> Path:
    """A private folder for the control sockets (a socket path must stay under ~100 bytes)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or str(Path.home() / ".cache" / "hpctrain")
    folder = Path(base) / "ssh"
    if len(str(folder)) > 60:
        folder = Path(TMP) / f"hpctrain-ssh-{os.getuid()}"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    # lstat: in a shared /tmp the name may be another user's symlink to a folder of theirs
    st = folder.lstat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or not stat.S_ISDIR(st.st_mode):
        raise UserError(
            f"{folder} (SSH control sockets) is not a folder private to you; fix: chmod 700 "
            f"{folder} (if it is a symlink or someone else's, remove it or set XDG_RUNTIME_DIR)"
        )
    return folder


def remote_word(text: str) -> str:
    """A profile path for the login node's shell: $VAR and a leading ~ are expanded there, nothing
    else (the schema allows no other shell syntax in these keys)."""
    if text == "~" or text.startswith("~/"):
        text = "$HOME" + text[1:]
    return f'"{text}"'


class SSH:
    """Commands, uploads and streams to one login node over one control connection."""

    def __init__(self, login: Login) -> None:
        self.login = login
        self.batch = not sys.stdin.isatty()

    def options(self) -> list[str]:
        login = self.login
        opts = [
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={control_dir()}/%C",
            "-o",
            f"ControlPersist={PERSIST_S}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-o",
            "ServerAliveInterval=30",
            "-o",
            f"BatchMode={'yes' if self.batch else 'no'}",
        ]
        if login.port:
            opts += ["-p", str(login.port)]
        if login.identity:
            opts += [
                "-i",
                os.path.expanduser(os.path.expandvars(login.identity)),
                "-o",
                "IdentitiesOnly=yes",
            ]
        if login.known_hosts:
            opts += [
                "-o",
                f"UserKnownHostsFile={os.path.expanduser(os.path.expandvars(login.known_hosts))}",
            ]
        return opts

    def argv(self, command: str) -> list[str]:
        """`ssh ... HOST -- COMMAND`: COMMAND is one string for the login node's shell."""
        return ["ssh", *self.options(), "-T", self.login.host, "--", command]

    def run(
        self,
        command: str,
        *,
        input: bytes | None = None,
        timeout: float | None = 120,
        check: bool = True,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run COMMAND on the login node, output captured; an SSH failure raises RemoteError."""
        try:
            proc = subprocess.run(
                self.argv(command),
                input=input,
                capture_output=True,
                timeout=timeout,
                stdin=None if input is not None else subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise RemoteError(
                f"{self.login.where}: no answer within {timeout:.0f} s; check the "
                "network, or `ssh` to it by hand"
            ) from None
        except FileNotFoundError:
            raise RemoteError("ssh is not installed here; install the OpenSSH client") from None
        if check:
            self.raise_for(proc.returncode, proc.stderr.decode(errors="replace"))
        return proc

    def stream(self, command: str) -> tuple[int, str]:
        """Run COMMAND with its stdout on ours and its stderr passed through line by line (live);
        returns its exit code and the last lines of its stderr, or raises RemoteError for an SSH
        failure."""
        proc = subprocess.Popen(
            self.argv(command), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        tail: list[str] = []
        assert proc.stderr is not None
        try:
            for raw in proc.stderr:
                line = raw.decode(errors="replace")
                tail = [*tail[-20:], line]
                if not _is_ssh_noise(line):
                    sys.stderr.write(line)
                    sys.stderr.flush()
            rc = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            return 130, ""
        if rc == SSH_FAILED:
            self.raise_for(rc, "".join(tail))
        return rc, "".join(tail)

    def raise_for(self, rc: int, stderr: str) -> None:
        """Turn ssh's failure into one line with the fix; a remote command's own failure passes."""
        if rc != SSH_FAILED:
            return
        where, text = self.login.where, stderr.strip()
        last = text.splitlines()[-1] if text else "ssh failed"
        low = text.lower()
        if (
            "host key verification failed" in low
            or "host identification has changed" in low
            or "no matching host key" in low
        ):
            port = f"-p {self.login.port} " if self.login.port else ""
            raise RemoteError(
                f"{where}: the host key is not in known_hosts or has changed (strict checking is "
                f"on); fix: run `ssh {port}{self.login.host}` once, compare the fingerprint with "
                "the site's "
                "documentation and accept it"
            )
        if "permission denied" in low or "too many authentication failures" in low:
            raise RemoteError(
                f"{where}: authentication failed ({last}); fix: check login.identity, `ssh-add` "
                f"your key, or log in once with `ssh {self.login.host}` (a password or MFA prompt "
                "needs a "
                "terminal)"
            )
        if any(
            s in low
            for s in (
                "could not resolve",
                "connection refused",
                "timed out",
                "no route to host",
                "network is unreachable",
                "connection closed",
                "connection reset",
            )
        ):
            raise RemoteError(
                f"{where}: host unreachable ({last}); fix: check login.host and "
                "login.port, your network or VPN"
            )
        raise RemoteError(f"{where}: ssh failed ({last})")

    # -- files ------------------------------------------------------------------------------------
    def upload(self, local: Path, remote_dir: str) -> str:
        """Copy the contents of folder `local` into `remote_dir` (created); rsync when both ends
        have it, else scp. Both go through the control connection. Returns the tool used."""
        self.run(f"mkdir -p {shlex.quote(remote_dir)}")
        ssh_cmd = shlex.join(["ssh", *self.options()])
        if shutil.which("rsync") and self.run("command -v rsync", check=False).returncode == 0:
            argv = ["rsync", "-a", "-e", ssh_cmd, f"{local}/", f"{self.login.host}:{remote_dir}/"]
            tool = "rsync"
        else:
            scp_opts = [o if o != "-p" else "-P" for o in self.options()]
            argv = [
                "scp",
                "-q",
                "-r",
                *scp_opts,
                *[str(p) for p in sorted(local.iterdir())],
                f"{self.login.host}:{remote_dir}/",
            ]
            tool = "scp"
        proc = subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip()
            self.raise_for(SSH_FAILED if "ssh" in err.lower() else 0, err)
            raise RemoteError(
                f"{self.login.where}: {tool} to {remote_dir} failed: "
                f"{err.splitlines()[-1] if err else proc.returncode}"
            )
        return tool

    def control(self, op: str, *args: str) -> subprocess.CompletedProcess[bytes]:
        """`ssh -O OP [ARGS] HOST`: a request to the running control master (check, forward,
        cancel, exit); it opens no connection."""
        return subprocess.run(
            ["ssh", *self.options(), "-O", op, *args, self.login.host],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=30,
        )

    def close(self) -> None:
        """Close the control connection now (else it closes after PERSIST_S idle)."""
        self.control("exit")


def _is_ssh_noise(line: str) -> bool:
    return line.startswith(("Shared connection to", "Connection to")) and "closed" in line


# Printed by the site's Python when it cannot start hpctrain (checked on each command's stderr).
_NO_PYTHON = ("command not found", "no such file or directory", "not found")
_NO_HPCTRAIN = "no module named hpctrain"


def check_started(login: Login, rc: int, stderr: str) -> None:
    """Raise the one-line error when the site's Python or its hpctrain is missing."""
    low = stderr.lower()
    if rc == 127 or (rc != 0 and any(s in low for s in _NO_PYTHON) and "python" in low):
        raise RemoteError(
            f"{login.where}: no Python at login.remote_python "
            f"{login.remote_python!r}; fix: set login.remote_python to the site's "
            "Python that has hpctrain installed"
        )
    if rc != 0 and _NO_HPCTRAIN in low and "hpctrain.remote" not in low:
        raise RemoteError(
            f"{login.where}: hpctrain is not installed for "
            f"{login.remote_python}; fix: `{login.remote_python} -m pip "
            "install hpctrain` on the site, or point login.remote_python at its venv"
        )
