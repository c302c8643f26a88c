"""The login-node agent: the site's hpctrain, started once per laptop connection and kept warm, so a
command from the laptop costs neither a login shell nor an interpreter start on the site.

    python -m hpctrain.agent.serve start --token T [--idle S] [--replace]

`start` runs from the site user's login shell (one ssh command), so the agent's environment is the
login node's ($SCRATCH, modules, Slurm on PATH). It imports hpctrain's CLI and the status/logs
services, listens on a unix socket `<folder>/<T>-<host>.sock` (folder 0700:
`$XDG_RUNTIME_DIR/hpctrain`, else `~/.cache/hpctrain/agent`, else `/tmp/hpctrain-agent-<uid>` when
the path is too long for a socket; <host> is the login node's short hostname, for homes shared by
several login nodes), prints one JSON line {"socket", "pid", "version", "proto"} and detaches.
When an agent for T is already up there it prints that one's line instead. The laptop reaches the
socket through a forwarded stream over its SSH control connection (hpctrain/remote/tunnel.py).

Each connection is taken by a spare process, forked from the warm agent ahead of time and waiting
in accept(): it checks the peer's uid (SO_PEERCRED: the agent's own, else it is turned away), reads
one request frame and runs the CLI's main with the request's argv itself, its stdout and stderr on
pipes that a thread sends back as frames, then the exit code. The agent forks the next spare
meanwhile. When the laptop closes the connection (Ctrl-C) the command's process group is stopped.

Frames: one kind byte, a 4-byte big-endian length, the payload.
  laptop -> agent  q  {"proto", "version", "argv"} or {"proto", "version", "quit": true}
  agent -> laptop  s  {"pid", "version"}: the command started     o / e  stdout / stderr bytes
                   x  the exit code (ASCII)                        r  {"error", ...}: refused
A request of another protocol is refused and the agent exits, as it does when one of its loaded
hpctrain source files has changed on disk (an upgrade on the site): the laptop then starts a
fresh one. It also exits after `--idle` seconds without a connection and when its socket file is
removed or replaced.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path

from hpctrain import __version__
from hpctrain.agent.session import _session, _sources
from hpctrain.kernel.files import write_atomic
from hpctrain.remote.wire import PROTO

IDLE_S = 600  # hpctrain.remote.ssh.PERSIST_S: the agent lives as long as an idle connection
CHECK_S = 5.0  # how often an idle agent checks that its socket file is still its own
_LEAVE_SIGNALS = {signal.SIGTERM, signal.SIGINT}
_WARM = (
    "hpctrain.cli",
    "hpctrain.cli.runs",
    "hpctrain.cli.resume",
    "hpctrain.cli.preempt",
    "hpctrain.cli.sweep",
    "hpctrain.runs.folder",
    "hpctrain.service.sweep",
    "hpctrain.runs.progress",
    "hpctrain.service.status",
    "hpctrain.service.logs",
    "hpctrain.checks.preflight.gate",
    "hpctrain.remote.forward",
    "hpctrain.runs.chain",
    "hpctrain.runs.procs",
    "hpctrain.dispatch.local",
    "hpctrain.dispatch.slurm",
    "hpctrain.dispatch.submitit_api",
    "yaml",
    "rich.console",
    "rich.table",
    "rich._emoji_codes",
)


class AgentError(Exception):
    pass


class _Leave(BaseException):
    """SIGTERM/SIGINT: stop serving now (raised from the handler, so select returns at once)."""


# -- where the socket lives ----------------------------------------------------------------------
def folder() -> Path:
    """The agent's private folder on the login node (0700, the user's own)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "hpctrain" if base else Path.home() / ".cache" / "hpctrain" / "agent"
    if len(str(path)) > 60:  # <path>/<token>-<host>.sock must stay within a socket's 108 bytes
        path = Path("/tmp") / f"hpctrain-agent-{os.getuid()}"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.lstat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or not path.is_dir() or path.is_symlink():
        raise AgentError(f"{path} is not a folder private to you; fix: chmod 700 {path}")
    return path


def _alive(pid_file: Path) -> int | None:
    """The pid of a running agent recorded in pid_file, else None."""
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"hpctrain.agent.serve" in cmdline else None


# -- start -----------------------------------------------------------------------------------------
def start(token: str, idle: float, replace: bool = False) -> dict[str, object]:
    """Listen (or find the agent already listening, unless `replace`) and detach; returns the
    line to print."""
    if not re.fullmatch(r"[0-9a-f]{8,32}", token):
        raise AgentError(f"bad token {token!r}: 8-32 hex digits")
    where = folder()
    # one agent per token and login node: a home folder shared by several login nodes holds each
    # node's own socket, and none replaces another's
    name = f"{token}-{socket.gethostname().split('.')[0][:16]}"
    path, pid_file = where / f"{name}.sock", where / f"{name}.pid"
    info = {"socket": str(path), "version": __version__, "proto": PROTO}
    old = _alive(pid_file)
    if old is not None and path.exists() and not replace:
        return {**info, "pid": old, "reused": True}
    if old is not None:  # refused the laptop's request, or its socket is gone: it is leaving
        os.kill(old, signal.SIGTERM)
        for _ in range(40):
            if _alive(pid_file) is None:
                break
            time.sleep(0.05)
    for mod in _WARM:
        try:
            __import__(mod)
        except ImportError:
            pass
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old_mask)
    listener.listen(64)
    sources = _sources()
    sys.stdout.flush()
    pid = os.fork()
    if pid:
        listener.close()
        write_atomic(pid_file, f"{pid}\n", mode=0o600, durable=False)
        return {**info, "pid": pid, "reused": False}
    try:  # the agent: its own session, no terminal, nothing of the ssh session's open
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        log = os.open(where / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        _serve(listener, path, idle, sources, __version__)
    finally:
        os._exit(0)


def _serve(
    listener: socket.socket,
    path: Path,
    idle: float,
    sources: dict[str, tuple[int, int]],
    version: str,
) -> None:
    """Keep one spare child waiting in accept(): a connection finds a process already forked, which
    runs the command itself. The agent forks the next spare while it does."""
    inode = os.stat(path).st_ino
    me = os.getpid()

    def leave(*_: object) -> None:
        raise _Leave

    signal.signal(signal.SIGTERM, leave)
    signal.signal(signal.SIGINT, leave)
    live: set[int] = set()  # spares that took a connection and still run its command
    spare: tuple[int, int] | None = None  # (pid, read end of the pipe it reports on)
    last = time.monotonic()
    try:
        while True:
            _reap(live)
            if spare is None:
                # no SIGTERM between the fork and `spare` being set: leaving would miss it
                signal.pthread_sigmask(signal.SIG_BLOCK, _LEAVE_SIGNALS)
                try:
                    spare = _spawn(listener, sources, version)
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, _LEAVE_SIGNALS)
            now = time.monotonic()
            if live:
                last = now
            if not _ours(path, inode) or (not live and now - last > idle):
                break
            try:
                ready, _, _ = select.select([spare[1]], [], [], min(CHECK_S, max(idle, 0.1)))
            except InterruptedError:
                continue
            if ready:  # the spare took a connection (or died): it is a session now
                took = os.read(spare[1], 1)
                os.close(spare[1])
                live.add(spare[0])
                spare = None
                last = time.monotonic()
                if not took:
                    time.sleep(1.0)  # it died waiting: do not fork in a tight loop
    except _Leave:
        pass
    finally:
        if os.getpid() == me:  # not a child that got the signal before resetting it
            _close(listener, path, inode=inode, spare=spare)


def _reap(live: set[int]) -> None:
    """Forget the sessions whose command ended."""
    for pid in list(live):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            live.discard(pid)


def _ours(path: Path, inode: int) -> bool:
    """Whether the socket file is still this agent's (not removed, not replaced by another's)."""
    try:
        return os.stat(path).st_ino == inode
    except OSError:
        return False  # removed: nobody can reach us any more


def _close(
    listener: socket.socket, path: Path, *, inode: int, spare: tuple[int, int] | None
) -> None:
    """The agent leaving: its socket, its pid file, its log when empty, and a spare still waiting
    for a connection (one that took one runs it to the end)."""
    try:
        if os.stat(path).st_ino == inode:
            path.unlink()
    except OSError:
        pass
    listener.close()
    pid_file, log = path.with_suffix(".pid"), path.with_suffix(".log")
    try:  # this agent's own pid file, and its log when nothing was written to it
        if pid_file.read_text().strip() == str(os.getpid()):
            pid_file.unlink()
        if log.stat().st_size == 0:
            log.unlink()
    except (OSError, ValueError):
        pass
    if spare is not None and not select.select([spare[1]], [], [], 0)[0]:
        try:
            os.kill(spare[0], signal.SIGTERM)
            os.waitpid(spare[0], 0)
        except OSError:
            pass


def _spawn(
    listener: socket.socket, sources: dict[str, tuple[int, int]], version: str
) -> tuple[int, int]:
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        return pid, r
    code = 1
    agent = os.getppid()
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _LEAVE_SIGNALS)
        os.close(r)
        listener.settimeout(CHECK_S)
        while True:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                if os.getppid() != agent:
                    os._exit(code)  # the agent is gone without stopping us: leave too
                continue
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            peer_pid, peer_uid, _ = struct.unpack("3i", creds)
            if peer_uid == os.getuid():
                break
            print(f"refused a connection from uid {peer_uid} (pid {peer_pid})", file=sys.stderr)
            conn.close()
        os.write(w, b"1")
        os.close(w)
        listener.close()
        code = _session(conn, sources, version)
    finally:
        os._exit(code)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "start" or argv[1] != "--token":
        print(__doc__, file=sys.stderr)
        return 2
    idle = float(argv[argv.index("--idle") + 1]) if "--idle" in argv else IDLE_S
    try:
        info = start(argv[2], idle, replace="--replace" in argv)
    except (AgentError, OSError) as e:
        print(f"hpctrain agent: {e}", file=sys.stderr)
        return 2
    print(json.dumps(info), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
