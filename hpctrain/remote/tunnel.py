"""This machine's end of the login-node agent (hpctrain/agent/serve.py): a local unix socket that
the SSH control connection forwards to the agent's socket on the site.

The first command of a connection starts the agent with one ssh command from the site's login
shell, then asks the control master to forward `<control dir>/agent-<key>.sock` (0600, in the
private control folder) to the agent's socket (`ssh -O forward -L LOCAL:REMOTE`): no new SSH
connection, no TCP port. Every later command connects to the local socket, sends its argv and
streams the answer: no login shell, no interpreter start on the site.

When the site refuses the forward (sshd `AllowStreamLocalForwarding no`, `DisableForwarding yes`)
or the agent cannot start, `run` returns None once with one note, and the caller uses the ssh exec
path; a marker next to the control socket remembers that for this control connection.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from typing import BinaryIO

from hpctrain import __version__
from hpctrain.kernel.files import write_atomic
from hpctrain.remote import wire
from hpctrain.remote.ssh import (
    PERSIST_S,
    SSH,
    RemoteError,
    check_started,
    control_dir,
    remote_word,
)

_CONNECT_TIMEOUT_S = 60.0  # until the agent says the command started


class Tunnel:
    def __init__(self, ssh: SSH) -> None:
        self.ssh = ssh
        login = ssh.login
        ident = json.dumps(
            [
                login.host,
                login.port,
                login.identity,
                login.remote_python,
                str(control_dir()),
                os.path.expanduser("~"),
            ]
        )
        self.token = hashlib.sha256(ident.encode()).hexdigest()[:16]
        self.local = control_dir() / f"agent-{self.token}.sock"
        self.marker = control_dir() / f"agent-{self.token}.json"

    # -- the one entry point ----------------------------------------------------------------------
    def run(self, argv: list[str], out: BinaryIO, err: BinaryIO) -> int | None:
        """`hpctrain ARGV` on the site through the agent, its stdout and stderr on `out`/`err`;
        its exit code, or None when the agent cannot be used (the caller runs it over ssh)."""
        if not self.ssh.login.agent:
            return None
        conn = self._request(argv)
        if conn == "refused" or (conn is None and not self._off()):
            if not self._setup(replace=conn == "refused"):
                return None
            conn = self._request(argv)
            if conn is None or conn == "refused":
                why = (
                    "the agent refused the request"
                    if conn
                    else "the site's sshd refuses to forward to its socket (sshd_config "
                    "AllowTcpForwarding, AllowStreamLocalForwarding or DisableForwarding)"
                )
                self._give_up(why)
                return None
        if not isinstance(conn, socket.socket):
            return None
        return self._pump(conn, out, err)

    def stop(self) -> None:
        """Ask the agent to leave now (it would after PERSIST_S idle) and drop the forward."""
        conn = self._connect()
        if conn is not None:
            try:
                wire.send(conn, b"q", json.dumps(self._hello(quit=True)).encode())
                wire.recv(conn)
            except OSError:
                pass
            conn.close()
        self._forward("cancel", self._state().get("remote"))
        self.local.unlink(missing_ok=True)
        self.marker.unlink(missing_ok=True)

    # -- requests ---------------------------------------------------------------------------------
    def _hello(self, **more: object) -> dict[str, object]:
        return {"proto": wire.PROTO, "version": __version__, **more}

    def _connect(self) -> socket.socket | None:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(str(self.local))
        except OSError:
            conn.close()
            return None
        return conn

    def _request(self, argv: list[str]) -> socket.socket | str | None:
        """A connection on which the agent has started ARGV; "refused" (another protocol, or an
        agent older than the site's install); None when nothing answers (nothing ran)."""
        conn = self._connect()
        if conn is None:
            return None
        try:
            conn.settimeout(_CONNECT_TIMEOUT_S)
            wire.send(conn, b"q", json.dumps(self._hello(argv=argv)).encode())
            frame = wire.recv(conn)
        except OSError:
            frame = None
        if frame is not None and frame[0] == b"s":
            conn.settimeout(None)
            return conn
        conn.close()
        return "refused" if frame is not None and frame[0] == b"r" else None

    def _pump(self, conn: socket.socket, out: BinaryIO, err: BinaryIO) -> int:
        streams = {b"o": out, b"e": err}
        try:
            while True:
                frame = wire.recv(conn)
                if frame is None:
                    raise RemoteError(
                        f"{self.ssh.login.where}: the connection to the hpctrain agent was lost "
                        "while the command ran; fix: check `hpctrain status` of the run, "
                        "then run the command again"
                    )
                kind, data = frame
                if kind == b"x":
                    return int(data)
                stream = streams.get(kind)
                if stream is not None:
                    stream.write(data)
                    stream.flush()
        except KeyboardInterrupt:
            return 130  # closing the connection stops the command on the site
        except BrokenPipeError:  # our reader went away (`| head`): stop quietly, as a pipe would
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
            except (OSError, ValueError):
                pass
            return 141
        finally:
            conn.close()

    # -- setting up -------------------------------------------------------------------------------
    def _state(self) -> dict[str, object]:
        try:
            data = json.loads(self.marker.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _master(self) -> int | None:
        """The control master's pid, or None when none is running."""
        proc = self.ssh.control("check")
        found = re.search(r"pid=(\d+)", proc.stderr.decode(errors="replace"))
        return int(found.group(1)) if proc.returncode == 0 and found else None

    def _off(self) -> bool:
        """True while this control connection is marked as one the agent cannot serve."""
        state = self._state()
        pid = state.get("off_master")
        if not isinstance(pid, int):
            return False
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True

    def _give_up(self, why: str) -> None:
        remote = self._state().get("remote")
        self._forward("cancel", remote)
        if isinstance(remote, str):  # an agent nobody can reach: its socket gone, it leaves
            self.ssh.run(f"rm -f {shlex.quote(remote)}", check=False)
        self.local.unlink(missing_ok=True)
        self._write({"off_master": self._master(), "why": why})
        print(
            f"note: {self.ssh.login.where}: the hpctrain agent is not used ({why}); commands go "
            "over ssh, each starting the site's login shell (login.agent: false skips the agent "
            "without this note)",
            file=sys.stderr,
            flush=True,
        )

    def _write(self, data: dict[str, object]) -> None:
        write_atomic(self.marker, json.dumps(data) + "\n", mode=0o600, durable=False)

    def _setup(self, *, replace: bool) -> bool:
        """Start (or find) the agent and forward the local socket to it; False after a note."""
        login = self.ssh.login
        command = (
            f"{remote_word(login.remote_python)} -m hpctrain.agent.serve start --token "
            f"{self.token} --idle {PERSIST_S}" + (" --replace" if replace else "")
        )
        proc = self.ssh.run(command, check=True)
        text = proc.stdout.decode(errors="replace").strip().splitlines()
        try:
            info = json.loads(text[-1]) if text else {}
        except ValueError:
            info = {}
        if proc.returncode != 0 or not isinstance(info, dict) or "socket" not in info:
            err = proc.stderr.decode(errors="replace")
            check_started(login, proc.returncode, err)  # no Python / no hpctrain: that error
            last = err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}"
            self._give_up(f"it did not start: {last}")
            return False
        if info.get("proto") != wire.PROTO:
            self._give_up(
                f"the site's hpctrain {info.get('version')} speaks agent protocol "
                f"{info.get('proto')}, this machine's {__version__} speaks {wire.PROTO}"
            )
            return False
        remote = str(info["socket"])
        old = self._state().get("remote")
        if old:
            self._forward("cancel", old)
        self.local.unlink(missing_ok=True)
        self._write({"remote": remote, "agent_pid": info.get("pid")})
        fwd = self._forward("forward", remote)
        if fwd is not None and fwd.returncode != 0 and self._connect() is None:
            err = fwd.stderr.decode(errors="replace").strip()
            self._give_up(f"the control connection did not forward: {err or proc.returncode}")
            return False
        return True

    def _forward(self, op: str, remote: object) -> subprocess.CompletedProcess[bytes] | None:
        if not isinstance(remote, str):
            return None
        return self.ssh.control(op, "-L", f"{self.local}:{remote}")
