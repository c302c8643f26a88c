"""This machine's index of runs that live on remote sites:
$XDG_STATE_HOME/hpctrain/remote-runs.jsonl, one line per submission
{"name", "path", "login", "profile", "time"} (newest wins)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Required, TypedDict, TypeGuard

from hpctrain.kernel.files import append_jsonl, utc_now


def index_file() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "hpctrain" / "remote-runs.jsonl"


class Entry(TypedDict, total=False):
    """One submission (record); `kind` since sweeps went remote."""

    name: Required[str]
    path: Required[str]  # the run folder on the site
    login: Required[dict[str, object]]  # ssh.Login.to_dict
    profile: str
    kind: str  # run | sweep
    time: str


def entries() -> list[Entry]:
    path = index_file()
    if not path.is_file():
        return []
    out: list[Entry] = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash: skip it
        if _is_entry(item):
            out.append(item)
    return out


def _is_entry(item: object) -> TypeGuard[Entry]:
    return (
        isinstance(item, dict)
        and isinstance(item.get("login"), dict)
        and isinstance(item.get("name"), str)
        and bool(item["name"])
        and isinstance(item.get("path"), str)
    )


def record(
    *, name: str, path: str, login: Mapping[str, object], profile: str, kind: str = "run"
) -> None:
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


def find(ref: str) -> tuple[Entry, str] | None:
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


def sites() -> list[dict[str, object]]:
    """Each distinct login seen, newest first."""
    seen: dict[str, dict[str, object]] = {}
    for item in reversed(entries()):
        key = json.dumps(item["login"], sort_keys=True)
        seen.setdefault(key, item["login"])
    return list(seen.values())
