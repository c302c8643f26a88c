"""The run index: one line per created run or sweep in the user's state dir
($XDG_STATE_HOME/hpctrain/runs.jsonl), so `hpctrain status NAME` works from any directory.

Below both run folders (hpctrain.runs.folder) and sweep folders (hpctrain.runs.sweepdir): it knows names and
paths only, never what is in a folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.kernel.errors import UserError
from hpctrain.kernel.files import append_jsonl, read_jsonl, utc_now
from hpctrain.kernel.values import frozen


@frozen
class Entry:
    name: str
    path: Path
    kind: str | None  # "sweep" for a sweep folder, None for a run


def path() -> Path:
    """The index file (it may not exist yet)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "hpctrain" / "runs.jsonl"


def entries() -> list[Entry]:
    """Every entry, oldest first (a cut-short or garbled line, or one whose name or path is not
    text, is skipped)."""
    out = []
    for e in read_jsonl(path()):
        name, where, kind = e.get("name", ""), e.get("path"), e.get("kind")
        if isinstance(where, str) and isinstance(name, str):
            out.append(Entry(name, Path(where), kind if isinstance(kind, str) else None))
    return out


def check_ref(ref: str) -> str:
    """A run or sweep reference (name or path) the filesystem can look up, else one line."""
    raw = ref.encode("utf-8", "surrogateescape")
    if b"\0" in raw or len(raw) >= 4096 or any(len(part) > 255 for part in raw.split(b"/")):
        raise UserError(
            f"{ref[:60]!r}... ({len(ref)} characters) is not a run name or path: a name has at "
            "most 255 bytes and a path 4095; `hpctrain runs` lists runs"
        )
    return ref


def record(name: str, where: Path, kind: str | None = None) -> None:
    """Append one entry: {"name", "path", "time"[, "kind"]}."""
    item = {"name": name, "path": str(where), "time": utc_now()}
    index = path()
    index.parent.mkdir(parents=True, exist_ok=True)
    append_jsonl(index, item if kind is None else {**item, "kind": kind})
