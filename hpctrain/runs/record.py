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
import stat
from collections.abc import Callable, Mapping
from dataclasses import field
from functools import cache, cached_property, lru_cache
from pathlib import Path
from typing import Generic, TypeVar

from hpctrain.kernel.errors import UserError
from hpctrain.kernel.files import jsonl_records
from hpctrain.kernel.values import frozen

T = TypeVar("T")
FIX = "fix: restore run.yaml from a backup, or move the folder away"
# a job id: digits, an array task's 12_3 or a het job's 12+0
JOB_ID_RE = re.compile(r"[0-9]{1,18}([_+][0-9]{1,9})?\Z")


class BrokenRun(UserError):
    """A run folder whose files cannot be read as a run (shown as a BROKEN row, not a crash)."""


@frozen
class RunRecord:
    """run.yaml as this hpctrain reads it. The fields are what `runs` and `status` show (read from
    the lines that hold them, shown()); `request`, `profile` and `document` parse the whole file
    on first use (resume, sweeps)."""

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
    path: Path
    whole: Callable[[], Mapping[str, object]] = field(repr=False, compare=False)
    """The whole file, parsed (BrokenRun if it cannot be)."""

    @cached_property
    def document(self) -> Mapping[str, object]:
        """The whole file, as parsed (RunDir.frozen() hands out a copy to rewrite)."""
        return self.whole()

    @property
    def request(self) -> Mapping[str, object]:
        return _section(self.document, "request", self.path)

    @property
    def profile(self) -> Mapping[str, object]:
        return _section(self.document, "profile", self.path)

    @classmethod
    def parse(
        cls,
        doc: Mapping[str, object],
        where: Path,
        whole: Callable[[], Mapping[str, object]] | None = None,
    ) -> RunRecord:
        """The record of a parsed run.yaml (`whole`: the whole file, when `doc` holds only the
        keys the fields read); BrokenRun naming the first key that is not what hpctrain wrote (a
        missing key is an older hpctrain's file: its default)."""
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
            path=where,
            whole=whole or (lambda: doc),
        )


# What RunRecord's fields read of run.yaml, as yaml.safe_dump writes it (block style, sorted keys,
# two spaces a level): top-level scalars, and keys of `profile` and `request`, each a scalar, a
# mapping of scalars or a list of scalars.
_TOP_SCALARS = ("created", "cwd", "node_python")
_SHOWN = {
    "profile": ("name", "scheduler", "preemption"),
    "request": ("args", "entry", "gpus", "nodes", "strategy", "time_min"),
}


class _Grammar:
    """The lines shown() reads, compiled on first use: a dozen patterns cost more than the rest
    of this module, and most commands that import it read no run.yaml (`submit`, `render`). Each
    pattern starts at a line's "\n" (a literal: re finds it fast); shown() reads "\n" + text."""

    def __init__(self) -> None:
        self.top = re.compile(r"\n([A-Za-z_][A-Za-z0-9_]*):(?: ([^\n]*))?(?=\n|\Z)")
        self.not_top = re.compile(r"\n(?![A-Za-z_][A-Za-z0-9_]*:(?: |\n|\Z)|- | |\n|\Z)")
        self.subs = {
            top: re.compile(rf"\n  ({'|'.join(keys)}):(?: ([^\n]*))?(?=\n|\Z)")
            for top, keys in _SHOWN.items()
        }
        self.sub_end = re.compile(r"\n(?!   |  - )")  # the next line as deep as a section's key
        self.not_sub = re.compile(r"\n(?!  [A-Za-z_][A-Za-z0-9_]*:(?: |\n|\Z)|  - |   |\n|\Z)")
        self.leaf = re.compile(r"    ([A-Za-z_][A-Za-z0-9_]*): (.*)")
        self.item = re.compile(r"  - (.*)")
        self.integer = re.compile(r"[-+]?(?:0|[1-9][0-9]{0,17})")
        # no indicator first, no comment
        self.plain = re.compile(r"(?:[A-Za-z0-9/_.~+=(]|-[^ ])[^#]*(?<!:)")


@cache
def _grammar() -> _Grammar:
    return _Grammar()


_NAMED: dict[str, object] = {"null": None, "~": None, "true": True, "false": False}
_EMPTY = {"[]": list, "{}": dict}  # how safe_dump writes an empty list or mapping


class _Odd(Exception):
    """run.yaml is not in the shape shown() reads: the whole file is parsed instead."""


def shown(text: str) -> dict[str, object] | None:
    """The keys of run.yaml that RunRecord's fields read, as YAML reads them, from their lines
    alone: `runs` reads every run's run.yaml, and the whole file (130 lines) costs 20x more. None
    where the file is not in the shape hpctrain writes (flow style, quoted or double-quoted
    text, anchors, tags, a value over several lines): the caller parses the whole file with the
    safe loader. A value that is not plain text, a whole number, true/false or null is odd."""
    g = _grammar()
    try:
        text = "\n" + text
        if "\n\n" in text or g.not_top.search(text) or _unread(text):
            return None
        tops = list(g.top.finditer(text))
        doc: dict[str, object] = {}
        for i, m in enumerate(tops):
            body = text[m.end() : tops[i + 1].start() if i + 1 < len(tops) else len(text)]
            key = m.group(1)
            if key in _TOP_SCALARS:
                doc[key] = _block(m.group(2), body, g.leaf)
            elif key in _SHOWN:
                if m.group(2) or g.not_sub.search(body):
                    return None
                doc[key] = _section_of(body, g.subs[key])
        return doc
    except _Odd:
        return None


def _unread(text: str) -> bool:
    """Characters YAML's reader refuses, or \r (another line break), in `text`: the whole file's
    parse says so. ASCII text (run.yaml as written) without a regex scan: its printable
    characters are exactly the ones YAML reads, but for a tab and a line break."""
    if text.isascii():
        return not text.replace("\n", "").replace("\t", "").isprintable()
    return _unreadable().search(text) is not None


@cache
def _unreadable() -> re.Pattern[str]:
    # compiled on first use: this set costs 50 M CPU instructions, more than any command that
    # imports this module spends on its own (`submit --dry-run` reads no run.yaml)
    return re.compile("[^\x09\x0a\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _section_of(body: str, keys: re.Pattern[str]) -> dict[str, object]:
    g = _grammar()
    out: dict[str, object] = {}
    for m in keys.finditer(body):  # a key written twice: the last one, as YAML reads it
        at, inline = m.end(), m.group(2)
        if inline is not None and (at == len(body) or g.sub_end.match(body, at)):
            out[m.group(1)] = _block(inline, "", g.leaf)  # one line (most keys): no search
            continue
        end = g.sub_end.search(body, at)
        out[m.group(1)] = _block(inline, body[at : end.start() if end else None], g.leaf)
    return out


def _block(inline: str | None, body: str, leaf: re.Pattern[str]) -> object:
    """A key's value: `inline` after `key: `, else the lines under it (`body`): a mapping of
    scalars (`leaf`) or a list of scalars (`- x` lines)."""
    lines = body.split("\n")[1:]  # body: "\n" + its lines
    if lines and not lines[-1]:
        lines.pop()  # the file's last line break
    if inline is not None:
        if lines:
            raise _Odd  # a value over several lines
        return _EMPTY[inline]() if inline in _EMPTY else _scalar(inline)
    if not lines:
        return None
    item = _grammar().item
    matches = [(item if lines[0].startswith("  - ") else leaf).fullmatch(line) for line in lines]
    if None in matches:
        raise _Odd  # a line that is neither (a nested mapping, a flow value, ...)
    found = [m.groups() for m in matches if m is not None]
    if lines[0].startswith("  - "):
        return [_scalar(item) for (item,) in found]
    return {key: _scalar(value) for key, value in found}


@lru_cache(maxsize=4096)  # runs share most values (local, USR2, ddp, a path): one reading each
def _scalar(raw: str) -> object:
    """One plain or single-quoted scalar as the safe loader reads it; _Odd for anything else."""
    if len(raw) >= 2 and raw[0] == raw[-1] == "'" and "'" not in raw[1:-1].replace("''", ""):
        return raw[1:-1].replace("''", "'")
    if raw in _NAMED:
        return _NAMED[raw]
    g = _grammar()
    if g.integer.fullmatch(raw):
        return int(raw)
    if not g.plain.fullmatch(raw) or raw != raw.strip() or ": " in raw or _resolved(raw):
        raise _Odd
    return raw


def _resolved(raw: str) -> bool:
    """Does YAML 1.1 read this plain scalar as something other than text (1.5, yes, 0x1f, a
    date, 1:30)?"""
    return _tag_of()(raw) != "tag:yaml.org,2002:str"


@cache
def _tag_of() -> Callable[[str], str]:
    """The tag YAML's safe resolver gives a plain scalar."""
    import yaml  # lazy: CLI start-up (`logs`, `cancel` read no run.yaml)

    resolver = yaml.resolver.Resolver()
    return lambda raw: str(resolver.resolve(yaml.ScalarNode, raw, (True, False)))  # type: ignore[no-untyped-call]


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


@frozen
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


def regular(path: str | Path) -> bytes | None:
    """A regular file's bytes; None when `path` is something else (a folder, a FIFO: never waited
    on). OSError when it cannot be opened or read. One open and no stat of the path: `runs` reads
    7 files of each of 10,000 runs."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # no effect on a regular file
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        # os calls, not open(): 4 system calls for a small file where a file object makes 10
        want, data = st.st_size + 1, b""  # one more: a file that grows is read to its end
        while chunk := os.read(fd, want):
            data += chunk
            if len(chunk) < want:  # a regular file's short read: its end
                break
        return data
    finally:
        os.close(fd)


def read(path: str | Path) -> bytes:
    """regular(), with b"" for a file that is missing, unreadable or not a regular file."""
    try:
        return regular(path) or b""
    except OSError:
        return b""


def jsonl(path: str | Path) -> list[dict[str, object]]:
    """Every JSON object of a JSON-lines file, as kernel.files.read_jsonl reads it, in one open."""
    return jsonl_records(read(path).decode(errors="replace").splitlines())


class Parsed(Generic[T]):
    """One file's parse, kept while the file is the same (inode, size and mtime): `status` asks
    about run.yaml and jobs.jsonl from several places, and a poll loop sees every change."""

    def __init__(self, path: str, parse: Callable[[str], T]) -> None:
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
