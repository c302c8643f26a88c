"""Writing files that readers may look at any moment: the one atomic write, JSON lines, the clock.

Everything that writes into a run folder goes through these (hpctrain.runs.folder.RunDir and train_entry).
"""

from __future__ import annotations

import datetime as _dt
import grp
import json
import os
import pwd
from collections.abc import Mapping
from pathlib import Path

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # every "time" field of every file we write: UTC, seconds


def utc_now(t: float | None = None) -> str:
    """The one clock: UTC, ISO 8601 to the second, `Z` suffix (what the batch script writes too);
    `t` (seconds since the epoch) formats a past moment the same way."""
    when = _dt.datetime.now(_dt.UTC) if t is None else _dt.datetime.fromtimestamp(t, _dt.UTC)
    return when.strftime(TIME_FORMAT)


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a rename is durable only once its directory is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: Path, data: str | bytes, *, mode: int | None = None, durable: bool = True
) -> None:
    """Replace `path` with `data`: a reader sees the old file or the new one, never half of one.

    A temporary file in the same folder (unique per process), flushed and fsynced, optionally
    chmod-ed, renamed over `path`; then the folder is fsynced (durable=False skips both fsyncs,
    for files that are cheap to lose but must never be torn). On any error the temporary file is
    removed and `path` is left as it was.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{os.urandom(3).hex()}")
    raw = data.encode() if isinstance(data, str) else data
    try:
        with open(tmp, "xb") as f:
            f.write(raw)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_path(path.parent)


def jsonl_records(lines: list[str]) -> list[dict[str, object]]:
    """The JSON objects among `lines`; a line cut short by a crash (or not an object) is skipped."""
    out = []
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def read_jsonl(path: Path) -> list[dict[str, object]]:
    """Every JSON object of a JSON-lines file; a missing or unreadable file has none."""
    try:
        text = path.read_text(errors="replace") if path.is_file() else ""
    except OSError:
        return []
    return jsonl_records(text.splitlines())


def append_jsonl(path: Path, record: Mapping[str, object], *, sort_keys: bool = True) -> None:
    """Append one JSON object as one line, in one write (O_APPEND: lines of concurrent writers
    never interleave below the pipe-buffer size)."""
    line = (json.dumps(record, sort_keys=sort_keys, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def private_group(gid: int, uid: int) -> bool:
    """A user private group (umask 002 under RHEL's and Debian's scheme): named as the user, with
    no other member listed, so its write bit lets nobody else in."""
    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(uid).pw_name
    except KeyError:
        return False
    return group.gr_name == user and set(group.gr_mem) <= {user}
