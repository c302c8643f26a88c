"""What a run is doing, from its folder: training progress (metrics.jsonl), when it failed the
first root-cause line (not torchrun's wrapper traceback), and its health (bad nodes, stalls, from
events.jsonl). Used by `submit --wait` and `status`.

No torch, no click: plain reads of the run folder, safe on a half-written last line.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.kernel.files import jsonl_records
from hpctrain.runs import trainer_progress

if TYPE_CHECKING:
    from rich.live import Live  # imported where the live display starts (CLI start-up)

METRICS = "metrics.jsonl"
TAIL_BYTES = 16384  # enough for the last ~40 metric lines; a long run's file is never read whole


def _tail_rows(path: Path, limit: int = 20) -> list[dict[str, Any]]:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            chunk = f.read().decode(errors="replace")
    except OSError:
        return []
    lines = chunk.splitlines()
    if size > TAIL_BYTES:
        lines = lines[1:]  # the first one is cut
    rows = []
    for line in lines[-limit:]:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def snapshot(run: Path, total: int | None = None) -> dict[str, Any] | None:
    """{"step", "total", "loss", "samples_per_s", "step_time_s", "eta_s", "age_s"} from the newest
    metrics lines, or None before the first step. `total`: max_steps when the lines lack it.
    A script that writes no metrics lines: what its trainer writes (trainer_progress), with a
    "source" naming the file."""
    rows = _tail_rows(Path(run) / METRICS)
    if not rows:

        return trainer_progress.snapshot(Path(run))
    last = rows[-1]
    total = last.get("max_steps") or total
    times = [r["step_time_s"] for r in rows[-10:] if isinstance(r.get("step_time_s"), (int, float))]
    step_time = sum(times) / len(times) if times else None
    # a progress line may carry no loss (a callback's step count between two of Trainer's logs)
    loss = next(
        (r["loss"] for r in reversed(rows) if isinstance(r.get("loss"), (int, float))), None
    )
    rate = next((r["samples_per_s"] for r in reversed(rows) if "samples_per_s" in r), None)
    eta = (total - last["step"]) * step_time if total and step_time is not None else None
    age = time.time() - last["time"] if isinstance(last.get("time"), (int, float)) else None
    return {
        "step": last["step"],
        "total": total,
        "loss": loss,
        "samples_per_s": rate,
        "step_time_s": step_time,
        "eta_s": eta,
        "age_s": age,
    }


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(max(0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def describe(snap: dict[str, Any] | None) -> str:
    """One line: `step 40/60  loss 2.112  310 samples/s  ETA 0:00:07`."""
    if snap is None:
        return "no training step yet"
    parts = [f"step {snap['step']}/{snap['total'] or '?'}"]
    if isinstance(snap.get("loss"), (int, float)):
        parts.append(f"loss {snap['loss']:.4g}")
    if isinstance(snap.get("samples_per_s"), (int, float)):
        parts.append(f"{snap['samples_per_s']:.0f} samples/s")
    if snap.get("total"):
        parts.append(f"ETA {clock(snap['eta_s'])}")
    if snap.get("source"):
        parts.append(f"(from {snap['source']})")
    return "  ".join(parts)


# ---------------------------------------------------------------- why it failed
_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:\s?")
_EXC = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure)|[A-Za-z_][\w.]*Error)"
    r"(?::.*)?$"
)
_WRAPPER = ("ChildFailedError", "torch.distributed.elastic")


def root_cause(run: Path) -> dict[str, str] | None:
    """{"line", "log"}: the first line that says why the run failed, and the file holding it.

    In order: the batch script's own `failed` reason (a setup failure), train_entry's `error:` line
    (a bad config: exit 2), the Python exception that ended rank 0 (the last line of its
    traceback), any rank's exception. torchrun's wrapper traceback (ChildFailedError) never counts.
    """
    run = Path(run)
    for event in reversed(_jsonl(run / "events.jsonl")):
        if event.get("event") == "failed" and event.get("reason"):
            return {"line": str(event["reason"]), "log": str(run / "logs" / "batch.log")}
        if event.get("event") in ("done", "requeue"):
            break
    logs = _logs(run)
    for log in logs:
        for raw in _read_lines(log):
            rank, line = _split(raw)
            if line.startswith("error: ") and rank in (None, 0):
                return {"line": line, "log": str(log)}
    found: dict[str, str] | None = None
    for log in logs:
        exc = _last_exception(_read_lines(log))
        if exc is not None:
            rank, line = exc
            if rank in (None, 0):
                return {"line": line, "log": str(log)}
            found = found or {"line": line, "log": str(log)}
    return found or _exit_code(logs)


_ROOT = re.compile(r"^\s*(host|rank|exitcode)\s*:\s*(.+?)\s*$")


# what `status` shows of a run's health (moved from checks/preflight/gate.py): the nodes the
# preflight gate named, and the stalls the watchdog recorded, from events.jsonl
def health(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What `status` shows: every node the gate named (newest reason), and every stall."""
    bad: dict[str, str] = {}
    stalls = []
    for e in events:
        if e.get("event") == "preflight":
            bad.update(e.get("bad") or {})
        elif e.get("event") == "stall":
            stalls.append(
                {k: e.get(k) for k in ("time", "job_id", "rank", "host", "last_step", "stacks")}
            )
    return {"bad_nodes": bad, "stalls": stalls}


def health_lines(info: dict[str, Any]) -> list[str]:
    out = [f"  bad node {name}: {why}" for name, why in info.get("bad_nodes", {}).items()]
    out += [
        f"  stall: rank {s['rank']} on {s['host']} after step {s['last_step']} "
        f"(job {s['job_id']}); "
        f"stacks in {s['stacks']}"
        for s in info.get("stalls", [])
    ]
    return out


def _exit_code(logs: list[Path]) -> dict[str, str] | None:
    """No exception anywhere: torchrun's 'Root Cause' block still says which rank exited how."""
    for log in logs:
        seen: dict[str, str] = {}
        for raw in _read_lines(log):
            m = _ROOT.match(_split(raw)[1])
            if m:
                seen[m.group(1)] = m.group(2)
            if {"host", "rank", "exitcode"} <= seen.keys():
                rank = seen["rank"].split()[0]
                code = seen["exitcode"].split()[0]
                return {
                    "line": f"rank {rank} on {seen['host']} exited with code {code} "
                    "(no Python exception in its output)",
                    "log": str(log),
                }
    return None


def _logs(run: Path) -> list[Path]:
    logs = run / "logs"
    own = sorted(logs.glob("rank-*.log"), key=lambda p: _num(p.stem))
    nodes = sorted(logs.glob("node-*.log"), key=lambda p: _num(p.stem))
    tee = sorted((logs / "torchrun").glob("node-*/*/attempt_*/*/stderr.log"))
    return [*own, *nodes, *tee]


def _num(stem: str) -> int:
    digits = stem.rsplit("-", 1)[-1]
    return int(digits) if digits.isdigit() else 0


def _split(raw: str) -> tuple[int | None, str]:
    m = _PREFIX.match(raw)
    return (int(m.group(1)), raw[m.end() :]) if m else (None, raw)


def _last_exception(lines: list[str]) -> tuple[int | None, str] | None:
    """The exception line of the newest traceback that is not torchrun's own."""
    found = None
    in_tb: dict[int | None, bool] = {}
    for raw in lines:
        rank, line = _split(raw)
        if line.startswith("Traceback (most recent call last)"):
            in_tb[rank] = True
            continue
        if in_tb.get(rank) and line and not line[0].isspace():
            in_tb[rank] = False
            if _EXC.match(line) and not any(w in line for w in _WRAPPER):
                found = (rank, line)
    return found


def _read_lines(path: Path, limit: int = 2_000_000) -> list[str]:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace").splitlines()
    except OSError:
        return []


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return jsonl_records(_read_lines(path))


# ---------------------------------------------------------------- following a run
class Follower:
    """Called with the job state at every poll of `submit --wait`: on a terminal one live line
    (rich), else one line a minute and at every state change."""

    def __init__(
        self,
        run: Path,
        *,
        total: int | None = None,
        every_s: float = 60.0,
        live: bool | None = None,
        out: Callable[[str], None] | None = None,
    ) -> None:
        self.run, self.total, self.every_s = Path(run), total, every_s
        self.out = out or (lambda s: print(s, file=sys.stderr, flush=True))
        self.live_mode = sys.stderr.isatty() if live is None else live
        self.last_state: str | None = None
        self.last_print = 0.0
        self.live: Live | None = None

    def line(self, state: str) -> str:
        snap = snapshot(self.run, self.total)
        text = f"{time.strftime('%H:%M:%S')} {state}"
        return text + ("  " + describe(snap) if snap is not None else "")

    def __call__(self, state: str) -> None:
        text = self.line(state)
        changed = state != self.last_state
        self.last_state = state
        if self.live_mode:
            if self.live is None:
                from rich.console import Console  # lazy: CLI start-up: the live display only
                from rich.live import Live  # lazy: as above

                self.live = Live(
                    text, console=Console(stderr=True), refresh_per_second=2, transient=False
                )
                self.live.start()
            elif changed:
                self.live.console.print(text)
            self.live.update(text)
            return
        now = time.monotonic()
        if changed or now - self.last_print >= self.every_s:
            self.out("  " + text)
            self.last_print = now

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
