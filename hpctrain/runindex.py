"""The run index: one line per created run or sweep in the user's state dir
($XDG_STATE_HOME/hpctrain/runs.jsonl), so `hpctrain status NAME` works from any directory.

Below both run folders (hpctrain.runs) and sweep folders (hpctrain.sweepdir): it knows names and
paths only, never what is in a folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hpctrain.kernel.files import append_jsonl, read_jsonl


def path() -> Path:
    """The index file (it may not exist yet)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "hpctrain" / "runs.jsonl"


def entries() -> list[dict[str, Any]]:
    """Every entry, oldest first (a cut-short or garbled line is skipped)."""
    return read_jsonl(path())


def record(item: dict[str, Any]) -> None:
    """Append one entry ({"name", "path", "time"[, "kind"]})."""
    where = path()
    where.parent.mkdir(parents=True, exist_ok=True)
    append_jsonl(where, item)
