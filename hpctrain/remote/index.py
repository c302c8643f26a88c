"""This machine's index of runs that live on remote sites:
$XDG_STATE_HOME/hpctrain/remote-runs.jsonl, one line per submission
{"name", "path", "login", "profile", "time"} (newest wins)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hpctrain.kernel.files import append_jsonl, utc_now


def index_file() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "hpctrain" / "remote-runs.jsonl"


def entries() -> list[dict[str, Any]]:
    path = index_file()
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash: skip it
        if (
            isinstance(item, dict)
            and isinstance(item.get("login"), dict)
            and isinstance(item.get("name"), str)
            and item["name"]
            and isinstance(item.get("path"), str)
        ):
            out.append(item)
    return out


def record(*, name: str, path: str, login: dict[str, Any], profile: str, kind: str = "run") -> None:
    file = index_file()
    file.parent.mkdir(parents=True, exist_ok=True)
    item = {
        "name": name,
        "path": path,
        "login": login,
        "profile": profile,
        "kind": kind,
        "time": utc_now(),
    }
    append_jsonl(file, item)


def find(ref: str) -> tuple[dict[str, Any], str] | None:
    """(entry, remote path) for a run name, a remote path, or SWEEP/POINT of a remote sweep."""
    items = entries()
    for item in reversed(items):
        if ref in (item["name"], item["path"]):
            return item, item["path"]
    head, sep, rest = ref.partition("/")
    if sep and rest and "/" not in rest:
        for item in reversed(items):
            if item["name"] == head:
                return item, f"{item['path']}/{rest}"
    return None


def sites() -> list[dict[str, Any]]:
    """Each distinct login seen, newest first."""
    seen: dict[str, dict[str, Any]] = {}
    for item in reversed(entries()):
        key = json.dumps(item["login"], sort_keys=True)
        seen.setdefault(key, item["login"])
    return list(seen.values())
