"""One connection to the login-node agent, in the spare process that took it: the request frame,
the CLI's main run in this warm process, its output sent back as frames (serve.py's docstring)."""

from __future__ import annotations

import io
import json
import os
import select
import signal
import socket
import sys
import threading
import traceback

from hpctrain.cli import main
from hpctrain.remote.wire import _HEAD, PROTO, recv, send

COALESCE_S = 0.003  # output waits this long for more before it is sent


def _sources() -> dict[str, tuple[int, int]]:
    """(mtime, size) of each loaded hpctrain source file: a change means the site upgraded."""
    out = {}
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if path and (name == "hpctrain" or name.startswith("hpctrain.")):
            try:
                st = os.stat(path)
            except OSError:
                continue
            out[path] = (st.st_mtime_ns, st.st_size)
    return out


def _session(conn: socket.socket, sources: dict[str, tuple[int, int]], version: str) -> int:
    conn.settimeout(30)
    frame = recv(conn)
    if frame is None or frame[0] != b"q":
        return 1
    req = json.loads(frame[1])
    refusal = None
    if req.get("proto") != PROTO:
        refusal = {"error": "protocol", "proto": PROTO, "version": version}
    elif _sources() != sources:
        refusal = {"error": "stale", "proto": PROTO, "version": version}
    if refusal or req.get("quit"):
        if refusal:
            send(conn, b"r", json.dumps(refusal).encode())
        else:
            send(conn, b"x", b"0")
        os.kill(os.getppid(), signal.SIGTERM)  # the agent leaves; the laptop starts a new one
        return 0
    conn.settimeout(None)
    os.setpgid(0, 0)  # the command and its children: one group to stop when the laptop leaves
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    send(conn, b"s", json.dumps({"pid": os.getpid(), "version": version}).encode())
    done = threading.Event()
    pump = threading.Thread(target=_pump, args=(conn, {out_r: b"o", err_r: b"e"}, done))
    pump.start()
    code = _work([str(a) for a in req["argv"]], out_w, err_w)
    done.set()
    pump.join()
    try:
        send(conn, b"x", str(code).encode())
    except OSError:
        pass
    return 0


def _pump(conn: socket.socket, kinds: dict[int, bytes], done: threading.Event) -> None:
    """Send the command's output as frames until its pipes close (or, once it has returned, until
    they stay quiet: a background child of its own may keep them open). Output is gathered until
    the command pauses for COALESCE_S (or 64 KiB): each frame is a message through the SSH channel,
    and a command's many small flushed writes would each pay for one. When the laptop goes away
    (Ctrl-C, a closed connection), the command's process group is stopped."""
    pending: list[tuple[bytes, bytes]] = []
    size = 0
    cfd = conn.fileno()
    try:
        while kinds:
            wait = COALESCE_S if pending else (0.5 if done.is_set() else None)
            ready, _, _ = select.select([*kinds, cfd], [], [], wait)
            if cfd in ready and not conn.recv(1024):
                os.killpg(0, signal.SIGTERM)
                return
            if not ready and not pending:
                break  # returned, and the pipes stay open but quiet
            for fd in ready:
                if fd == cfd:
                    continue
                data = os.read(fd, 65536)
                if not data:
                    del kinds[fd]
                elif pending and pending[-1][0] == kinds[fd]:
                    pending[-1] = (kinds[fd], pending[-1][1] + data)
                else:
                    pending.append((kinds[fd], data))
                size += len(data)
            if pending and (not ready or size >= 65536 or not kinds):
                conn.sendall(b"".join(_HEAD.pack(k, len(d)) + d for k, d in pending))
                pending.clear()
                size = 0
    except OSError:
        os.killpg(0, signal.SIGTERM)


def _work(argv: list[str], out_w: int, err_w: int) -> int:
    """`hpctrain ARGV` in this warm process, as `python -m hpctrain ARGV` would run it, with its
    stdin empty and its stdout/stderr on the pipes; its exit code. Its fds 1 and 2 are closed
    after, so the pipes end."""
    code = 1
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
        errors="backslashreplace",
        line_buffering=True,
    )
    sys.argv = ["hpctrain", *argv]
    try:
        main.main(args=argv, prog_name="hpctrain")
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os.dup2(null, 1)
    os.dup2(null, 2)
    return code
