"""run.yaml and jobs.jsonl as records: what `status`, `runs`, `resume`, `report`, `logs` and the
schedulers read of a run folder. RunDir (hpctrain/runs/folder.py) parses each file once and keeps
the record while the file is unchanged.

RunRecord is the seam for a typed job spec: run.yaml freezes the request (JobRequest.to_dict()) and
the resolved profile (model_dump) as mappings; `resume` validates them again as this hpctrain's
types, and every other reader uses the fields below. A frozen spec (hpctrain/jobs/spec.py) would
replace `request` here, and the fields would read from it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from hpctrain.kernel.errors import UserError

T = TypeVar("T")
FIX = "fix: restore run.yaml from a backup, or move the folder away"
# a job id: digits, an array task's 12_3 or a het job's 12+0
JOB_ID_RE = re.compile(r"[0-9]{1,18}([_+][0-9]{1,9})?\Z")


class BrokenRun(UserError):
    """A run folder whose files cannot be read as a run (shown as a BROKEN row, not a crash)."""


@dataclass(frozen=True)
class RunRecord:
    """run.yaml as this hpctrain reads it."""

    scheduler: str
    """profile.scheduler: `local` when unset."""
    profile_name: str | None
    preempt_signal: str | None
    """profile.preemption.signal (None: the default, USR2)."""
    spare_nodes: int
    """profile.preemption.spare_nodes (0: none)."""
    nodes: int | None
    gpus: int | None
    strategy: str | None
    entry_kind: str
    """request.entry.kind: train_entry, script or module."""
    args: tuple[str, ...]
    """The entry's arguments."""
    time_min: int | None
    created: str | None
    cwd: str | None
    """Where `submit` ran: relative entry arguments point there."""
    node_python: str | None
    request: Mapping[str, object]
    profile: Mapping[str, object]
    document: Mapping[str, object]
    """The whole file, as parsed (RunDir.frozen() hands out a copy to rewrite)."""

    @classmethod
    def parse(cls, doc: Mapping[str, object], where: Path) -> RunRecord:
        """The record of a parsed run.yaml; BrokenRun naming the first key that is not what
        hpctrain wrote (a missing key is an older hpctrain's file: its default)."""
        req, prof = _section(doc, "request", where), _section(doc, "profile", where)
        pre = prof.get("preemption") or {}
        if not isinstance(pre, Mapping):
            raise _broken(where, "profile.preemption", pre, "a mapping")
        entry = req.get("entry") or {}
        if not isinstance(entry, Mapping):
            raise _broken(where, "request.entry", entry, "a mapping")
        args = req.get("args") or []
        if not isinstance(args, list | tuple):
            raise _broken(where, "request.args", args, "a list")
        return cls(
            scheduler=_get(prof, "profile.scheduler", str, where) or "local",
            profile_name=_get(prof, "profile.name", str, where),
            preempt_signal=_get(pre, "profile.preemption.signal", str, where),
            spare_nodes=_get(pre, "profile.preemption.spare_nodes", int, where) or 0,
            nodes=_get(req, "request.nodes", int, where),
            gpus=_get(req, "request.gpus", int, where),
            strategy=_get(req, "request.strategy", str, where),
            entry_kind=_get(entry, "request.entry.kind", str, where) or "train_entry",
            args=tuple(str(a) for a in args),
            time_min=_get(req, "request.time_min", int, where),
            created=_get(doc, "created", str, where),
            cwd=_get(doc, "cwd", str, where),
            node_python=_get(doc, "node_python", str, where),
            request=req,
            profile=prof,
            document=doc,
        )


def _section(doc: Mapping[str, object], key: str, where: Path) -> Mapping[str, object]:
    value = doc.get(key)
    if not isinstance(value, Mapping):
        raise BrokenRun(f"{where} has no {key} section: the run is broken; {FIX}")
    return value


def _get(section: Mapping[str, object], key: str, kind: type[T], where: Path) -> T | None:
    value = section.get(key.rsplit(".", 1)[-1])
    if value is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _broken(where, key, value, f"a {'whole number' if kind is int else 'text'}")
    return value


def _broken(where: Path, key: str, value: object, want: str) -> BrokenRun:
    return BrokenRun(f"{where}: {key} is {str(value)[:60]!r}, not {want}: the run is broken; {FIX}")


@dataclass(frozen=True)
class Job:
    """One submission: a jobs.jsonl line whose job_id is a job id. A line without one is never a
    Job: it would reach scancel's argv as an option (`--user=me` cancels every job of yours)."""

    job_id: str
    kind: str | None
    """submit, resume, chain (a chain's segment), sweep (an array task)."""
    line: Mapping[str, object]
    """The line as written (`status --json` shows it whole)."""

    @classmethod
    def of(cls, line: Mapping[str, object]) -> Job | None:
        job_id = line.get("job_id", "")
        if isinstance(job_id, bool) or not JOB_ID_RE.match(str(job_id)):
            return None
        kind = line.get("kind")
        return cls(str(job_id), kind if isinstance(kind, str) else None, line)


class Parsed(Generic[T]):
    """One file's parse, kept while the file is the same (inode, size and mtime): `status` asks
    about run.yaml and jobs.jsonl from several places, and a poll loop sees every change."""

    def __init__(self, path: Path, parse: Callable[[Path], T]) -> None:
        self.path, self.parse = path, parse
        self.key: tuple[int, int, int] | None = None
        self.value: tuple[T] | None = None  # a 1-tuple: the parse may be None

    def get(self) -> T:
        try:
            st = os.stat(self.path)
            key: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            key = None
        if self.value is None or key != self.key or key is None:
            self.value, self.key = (self.parse(self.path),), key
        return self.value[0]
