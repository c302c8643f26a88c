"""The agent's wire format, shared by the login-node agent (hpctrain/agent/serve.py) and the laptop's end
(tunnel.py): one kind byte, a 4-byte big-endian length, the payload (hpctrain/agent/serve.py's docstring lists
the kinds). Bump PROTO when the frames change."""

from __future__ import annotations

import socket
import struct

PROTO = 1
_HEAD = struct.Struct(">cI")


def send(conn: socket.socket, kind: bytes, payload: bytes = b"") -> None:
    conn.sendall(_HEAD.pack(kind, len(payload)) + payload)


def _exactly(conn: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def recv(conn: socket.socket) -> tuple[bytes, bytes] | None:
    """One frame (kind, payload), or None at end of stream."""
    head = _exactly(conn, _HEAD.size)
    if head is None:
        return None
    kind, size = _HEAD.unpack(head)
    payload = _exactly(conn, size) if size else b""
    return None if payload is None else (kind, payload)
