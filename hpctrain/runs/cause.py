"""Why a run failed, in one line: the rank and node that failed first and how (a signal, a Python
exception, an exit code), never a rank that only lost its peer, nor torchrun's wrapper traceback.

Read from the run folder, the newest start only:
- events.jsonl: the batch script's own `failed` reason (a setup failure) wins outright, then
  train_entry's `error:` line (a bad config: exit 2, said by rank 0);
- failures/<job>-<restart>/rank-<R>.json: a rank's own record of the exception that ended it
  (hpctrain/kernel/failures.py), with a sub-second time and whether it only lost a peer;
- logs/node-<N>.log: every failure that torchrun's ChildFailedError blocks list (time, host, rank,
  exit code or signal), and `[rankR]:` tracebacks, for ranks that wrote no record;
- logs/batch.log under launcher srun: `srun: error: n2: task 3: Killed`.

Each failing rank gets a weight: a cause (a killing signal, its own exception) before an exit code
with nothing more known, before a stop signal (TERM, INT, HUP, or srun's kill after another task
failed), before a lost peer. The first is the lowest weight, then the earliest time (untimed srun
lines first: srun reports in the order it saw), then the order found. Used by `status` and
`submit --wait`; no torch, no click.
"""

from __future__ import annotations

import heapq
import json
import os
import re
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from hpctrain.kernel import exitcodes, layout
from hpctrain.kernel.failures import folder, lost_peer
from hpctrain.kernel.files import jsonl_records

CAUSE, EXIT, STOPPED, LOST_PEER = 0, 1, 2, 3
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
_STRSIGNAL = {signal.strsignal(s): s for s in signal.Signals if signal.strsignal(s)}

_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:\s?")
_EXC = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure)|[A-Za-z_][\w.]*Error)"
    r"(?::.*)?$"
)
_WRAPPER = ("ChildFailedError", "torch.distributed.elastic")  # torchrun's own traceback
_FIELD = re.compile(r"^\s*(time|host|rank|exitcode)\s*:\s*(.+?)\s*$")
# the per-node command's first line at each start (templates/sbatch.sh.j2)
_HEADER = re.compile(r"^hpctrain: node \d+ (?:task (\d+) .*)?on (\S+) .*restart=(\S+)")
_SRUN = re.compile(r"^srun: error: (\S+): tasks? ([\d,\-]+): (.+?)\s*$")
_SRUN_STOP = ("_step_signal: Terminating", "CANCELLED AT")
_START = "hpctrain: start of job "  # the batch shell's line at each start


@dataclass(frozen=True)
class Cause:
    """Why a run failed: `line` says it in one line, `log` is where to read more. A rank's cause
    names the rank and how it ended (kind signal, exception, exit or lost_peer); the batch
    script's reason (setup), train_entry's `error:` line (config) and an exception found in a
    log with no failing rank known (exception) name no rank."""

    kind: str
    line: str
    log: str | None
    rank: int | None = None
    node: int | None = None
    host: str | None = None
    signal: int | None = None
    error: str | None = None
    exit_code: int | None = None

    def to_json(self) -> dict[str, object]:
        """`status --json`'s root_cause: only the keys its kind has."""
        if self.rank is None:
            return {"kind": self.kind, "line": self.line, "log": self.log}
        how: dict[str, object] = (
            {"signal": self.signal}
            if self.kind == "signal"
            else {"exit_code": self.exit_code}
            if self.kind == "exit"
            else {"error": self.error}
        )
        who = {"rank": self.rank, "node": self.node, "host": self.host, "kind": self.kind}
        return who | how | {"line": self.line, "log": self.log}


@dataclass
class Failure:
    """What is known of one rank's end; sources fill in what they know."""

    rank: int
    host: str | None = None
    node: int | None = None  # its node's index (node-<N>.log)
    node_log: str | None = None
    time: float | None = None
    order: int = 0
    signal: int | None = None
    stopped: bool = False  # the signal came after the job step was already being stopped
    exit_code: int | None = None
    error: str | None = None  # the exception's line
    error_log: str | None = None
    lost_peer: bool = False

    def weight(self) -> int:
        if self.signal is not None:
            return STOPPED if self.stopped or self.signal in STOP_SIGNALS else CAUSE
        if self.error is not None:
            return LOST_PEER if self.lost_peer else CAUSE
        return EXIT

    def key(self) -> tuple[int, int, float, int]:
        return (self.weight(), self.time is not None, self.time or 0.0, self.order)

    def describe(self) -> Cause:
        who = f"rank {self.rank}" + (f" on {self.host}" if self.host else "")
        log = (self.error_log if self.error else None) or self.node_log
        at = Cause("exit", "", log, rank=self.rank, node=self.node, host=self.host)
        if self.signal is not None:
            name = _signame(self.signal)
            how = f"was killed by signal {self.signal}" + (f" ({name})" if name else "")
            return replace(at, kind="signal", line=f"{who} {how}", signal=self.signal)
        if self.error is not None:
            lost = " (it lost a peer; no rank recorded a cause)" if self.lost_peer else ""
            kind = "lost_peer" if self.lost_peer else "exception"
            return replace(at, kind=kind, line=f"{who}: {self.error}{lost}", error=self.error)
        line = f"{who} exited with code {self.exit_code} (no Python exception in its output)"
        return replace(at, line=line, exit_code=self.exit_code)


Rank = Callable[[int], Failure]  # the Failure of a rank, made at its first mention

# What `status` reads of a big run (issue 37: a failed 1,000 x 8 run read 1.7 GB): node logs by
# their tails, the records in the order they were written (their mtime), and a rank's own log only
# while it could still be the first failure.
TAIL = 4 << 10  # a node log's tail; four times more while it starts inside torchrun's block
TAIL_MAX = 1 << 20
HEAD = 2 << 10  # node-0.log's first header says the launcher
RANK_LOGS = 64  # rank logs read (tails) to explain ranks that left no record
SLACK_S = 2.0  # a record's mtime after its own time (a slow shared filesystem)


def root_cause(run: Path) -> Cause | None:
    """Why the run's newest start failed; None when nothing says why."""
    run = Path(run)
    for event in reversed(_jsonl(run / layout.EVENTS)):
        if event.get("event") == "failed" and event.get("reason"):
            reason = str(event["reason"])
            return Cause("setup", reason, str(run / layout.BATCH_LOG))
        if event.get("event") in ("done", "requeue"):
            break
    nodes = {p: _newest(_node_lines(p)) for p in _sorted(run, "logs/node-*.log")}
    for log, lines in nodes.items():
        for raw in lines:
            rank, line = _split(raw)
            if line.startswith("error: ") and rank in (None, 0):
                return Cause("config", line, str(log))
    ranks: dict[int, Failure] = {}

    def at(rank: int) -> Failure:
        return ranks.setdefault(rank, Failure(rank=rank, order=len(ranks)))

    for log, lines in nodes.items():
        _torchrun_blocks(lines, log, at)
    head = _read_lines(run / layout.node_log(0), HEAD, whole=False)
    if _srun_launcher([*nodes.values(), head]):  # its `task N` is a rank (under torchrun: a node)
        _srun_lines(run, at)
    records = _Records(run, at)
    records.read(ranks)
    # tracebacks explain a failing rank that left no record: its own log first, then its node's
    told: dict[int, tuple[str, str]] = {}
    for log, lines in reversed(nodes.items()):
        told |= {r: (x, str(log)) for r, x in _exceptions(lines, None, log) if r is not None}
    own = {_num(p.stem): p for p in _sorted(run, "logs/rank-*.log")}
    reads = iter(range(RANK_LOGS))  # rank logs read at most

    def explain(f: Failure) -> None:
        records.apply(f.rank)
        log = own.get(f.rank) if f.error is None and f.signal is None else None
        mine = (
            [(x, str(log)) for r, x in _exceptions(_node_lines(log), f.rank, log) if r == f.rank]
            if log and next(reads, None) is not None
            else []
        )
        if found := next(iter(mine), None) or told.get(f.rank):
            f.error, f.error_log, f.lost_peer = found[0], found[1], lost_peer(found[0])

    first = _first(ranks, explain)
    if first is not None:
        return first.describe()
    return _any_exception(run, nodes)


def _first(ranks: dict[int, Failure], explain: Callable[[Failure], None]) -> Failure | None:
    """The failure with the lowest key. A rank known only by an exit code may still turn out to
    be a cause (its record, a traceback) or a lost peer: it is ranked as a cause (a second early:
    a record's time is finer than torchrun's) until explained, and explained only when it comes
    first, so the ranks that failed later are never read."""
    ok = (exitcodes.OK, exitcodes.PREEMPTED)
    heap: list[tuple[tuple[int, int, float, int], int, bool]] = []
    for f in ranks.values():
        if open_ := f.signal is None and f.error is None:
            _, timed, t, order = f.key()
            heapq.heappush(heap, ((CAUSE, timed, t - 1.0, order), f.rank, True))
        elif f.exit_code not in ok or f.signal or f.error:
            heapq.heappush(heap, (f.key(), f.rank, False))
    while heap:
        _, rank, open_ = heapq.heappop(heap)
        if not open_:
            return ranks[rank]
        explain(f := ranks[rank])
        if f.exit_code not in ok or f.signal or f.error:
            heapq.heappush(heap, (f.key(), rank, False))
    return None


def _torchrun_blocks(lines: list[str], log: Path, at: Rank) -> None:
    """Every failure a ChildFailedError block lists (the 'Root Cause' and the 'Other Failures')."""
    seen: dict[str, str] = {}
    # the node's own name, as the start line wrote it (torchrun's getfqdn may say `localhost`)
    own = next((m.group(2) for x in lines if (m := _HEADER.match(x))), None)
    for raw in lines:
        m = _FIELD.match(_split(raw)[1])
        if not m:
            continue
        seen[m.group(1)] = m.group(2)
        if {"time", "host", "rank", "exitcode"} <= seen.keys():
            rank, code = int(seen["rank"].split()[0]), int(seen["exitcode"].split()[0])
            f = at(rank)
            f.host, f.node_log, f.node = own or seen["host"], str(log), _num(log.stem)
            when = _when(seen["time"])
            f.time = when if f.time is None or when is None else min(f.time, when)
            if code < 0:
                f.signal = -code
            else:
                f.exit_code = code
            seen = {}


def _srun_lines(run: Path, at: Rank) -> None:
    """launcher srun: srun's line per task; one after srun began stopping the step is a stop."""
    stopping = False
    for line in _since_start(_read_lines(run / layout.BATCH_LOG)):
        if any(s in line for s in _SRUN_STOP):
            stopping = True
        m = _SRUN.match(line)
        if not m:
            continue
        host, tasks, what = m.groups()
        for rank in _task_ranks(tasks):
            f = at(rank)
            f.host = f.host or host
            f.node_log = f.node_log or str(run / layout.BATCH_LOG)
            code = re.match(r"Exited with exit code (\d+)", what)
            if code:
                f.exit_code = int(code.group(1))
            elif what in _STRSIGNAL:
                f.signal, f.stopped = int(_STRSIGNAL[what]), stopping


class _Records:
    """The ranks' own records of this start (train_entry writes one at an exception), read in the
    order they were written (mtime, from the listing: no bytes read) and each at most once."""

    def __init__(self, run: Path, at: Rank) -> None:
        self.run, self.at = run, at
        self.paths: dict[int, tuple[float, Path]] = {}
        starts = _jsonl(run / layout.RESTARTS)
        if not starts:
            return
        last = starts[-1]
        where = run / folder(str(last.get("job_id")), str(last.get("restart_count", 0)))
        try:
            with os.scandir(where) as listing:
                for e in listing:
                    if e.name.startswith("rank-") and e.name.endswith(".json"):
                        self.paths[_num(e.name[:-5])] = (e.stat().st_mtime, Path(e.path))
        except OSError:
            pass

    def read(self, ranks: dict[int, Failure]) -> None:
        """Every record written before the earliest cause known (+ SLACK_S), oldest first: a
        record written later cannot hold an earlier time; the rest only when a rank asks."""
        keys = [f.key() for f in ranks.values() if f.weight() == CAUSE]
        best = min(keys)[2] if keys else None
        if keys and not min(keys)[1]:
            return  # an untimed cause (srun's line) comes before every timed one
        for rank, (mtime, _) in sorted(self.paths.items(), key=lambda kv: (kv[1][0], kv[0])):
            if best is not None and mtime > best + SLACK_S:
                break
            if (f := self.apply(rank)) and f.weight() == CAUSE and f.time is not None:
                best = f.time if best is None else min(best, f.time)

    def apply(self, rank: int) -> Failure | None:
        """Rank `rank`'s record, when it has one not read yet."""
        if rank not in self.paths:
            return None
        _, path = self.paths.pop(rank)
        try:
            rec = json.loads(path.read_text())
            rank = int(rec["rank"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        f = self.at(rank)
        f.host = f.host or rec.get("host")
        if isinstance(rec.get("node"), int):
            f.node = rec["node"] if f.node is None else f.node
            f.node_log = f.node_log or str(self.run / layout.node_log(rec["node"]))
        if isinstance(rec.get("time"), (int, float)):
            f.time = float(rec["time"])  # sub-second: better than torchrun's whole seconds
        f.error, f.lost_peer = str(rec.get("error")), bool(rec.get("lost_peer"))
        f.error_log = f.node_log or str(path)
        if f.exit_code is None and f.signal is None:
            f.exit_code = 1
        return f


def _any_exception(run: Path, nodes: dict[Path, list[str]]) -> Cause | None:
    """No rank is known to have failed (a user script without torchrun's blocks): the newest
    exception any log holds, rank 0's first (tails; at most RANK_LOGS rank logs and tees)."""
    found = None
    ranks, tees = _sorted(run, "logs/rank-*.log")[:RANK_LOGS], _tees(run)[:RANK_LOGS]
    for log in [*ranks, *nodes, *tees]:
        for rank, line in _exceptions(nodes.get(log) or _node_lines(log), None, log):
            if rank in (None, 0):
                return Cause("exception", line, str(log))
            found = found or Cause("exception", line, str(log))
    return found


def _exceptions(lines: list[str], own: int | None, log: Path) -> list[tuple[int | None, str]]:
    """(rank, line) of each rank's newest traceback that is not torchrun's own. `own`: the rank
    of a rank-R.log (its lines carry no prefix)."""
    found: dict[int | None, str] = {}
    in_tb: dict[int | None, bool] = {}
    for raw in lines:
        rank, line = _split(raw)
        rank = own if rank is None and log.stem.startswith("rank-") else rank
        if line.startswith("Traceback (most recent call last)"):
            in_tb[rank] = True
            continue
        if in_tb.get(rank) and line and not line[0].isspace():
            in_tb[rank] = False
            if _EXC.match(line) and not any(w in line for w in _WRAPPER):
                found[rank] = line
    return list(found.items())


def _srun_launcher(logs: Iterable[list[str]]) -> bool:
    """The per-node command under launcher srun names its task in its header."""
    return any((m := _HEADER.match(x)) and m.group(1) for lines in logs for x in lines)


def _newest(lines: list[str]) -> list[str]:
    """A node log's lines of the newest start: from the first of the last run of headers with
    the same restart count (launcher srun writes one header per task)."""
    heads = [(i, m.group(3)) for i, x in enumerate(lines) if (m := _HEADER.match(x))]
    if not heads:
        return lines
    start, key = heads[-1]
    for i, k in reversed(heads):
        if k != key:
            break
        start = i
    return lines[start:]


def _since_start(lines: list[str]) -> list[str]:
    starts = [i for i, x in enumerate(lines) if x.startswith(_START)]
    return lines[starts[-1] + 1 :] if starts else lines


def _task_ranks(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (hi.isdigit() or not hi):
            out += range(int(lo), int(hi or lo) + 1)
    return out


def _when(text: str) -> float | None:
    """torchrun's `2026-12-04_01:58:30` (the node's local time, whole seconds)."""
    try:
        return datetime.fromisoformat(text.replace("_", "T")).timestamp()
    except ValueError:
        return None


def _signame(num: int) -> str | None:
    try:
        return signal.Signals(num).name
    except ValueError:
        return None


def _sorted(run: Path, pattern: str) -> list[Path]:
    return sorted(run.glob(pattern), key=lambda p: _num(p.stem))


def _tees(run: Path) -> list[Path]:
    return sorted((run / layout.LOGS / "torchrun").glob("node-*/*/attempt_*/*/stderr.log"))


def _num(stem: str) -> int:
    digits = stem.rsplit("-", 1)[-1]
    return int(digits) if digits.isdigit() else 0


def _split(raw: str) -> tuple[int | None, str]:
    m = _PREFIX.match(raw)
    return (int(m.group(1)), raw[m.end() :]) if m else (None, raw)


def _read_lines(path: Path, limit: int = 1 << 20, *, whole: bool = True) -> list[str]:
    """The last `limit` bytes' lines (a line cut at the start dropped); whole=False: the first."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - limit) if whole else 0)
            lines = f.read(limit).decode(errors="replace").splitlines()
    except OSError:
        return []
    return lines[1:] if whole and size > limit and lines else lines


def _node_lines(path: Path) -> list[str]:
    """A log's tail, read further back while it starts inside torchrun's failure block (a field
    line before the block's `Failures:`), so every failure the block lists is whole."""
    size = TAIL
    while True:
        lines = _read_lines(path, size)
        heads = [i for i, x in enumerate(lines) if _split(x)[1].startswith("Failures:")]
        fields = [i for i, x in enumerate(lines) if _FIELD.match(_split(x)[1])]
        if not fields or (heads and heads[0] < fields[0]) or size >= TAIL_MAX:
            return lines
        if size >= (path.stat().st_size if path.exists() else 0):
            return lines
        size *= 4


def _jsonl(path: Path) -> list[dict[str, object]]:
    return jsonl_records(_read_lines(path))
