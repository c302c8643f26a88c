"""What a run is doing, from its folder: training progress (metrics.jsonl) and its health (bad
nodes, stalls, from events.jsonl). Used by `submit --wait` and `status`; why a run failed is
hpctrain/runs/cause.py.

No torch, no click: plain reads of the run folder, safe on a half-written last line.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


# what `status` shows of a run's health (moved from checks/preflight/gate.py): the nodes the
# preflight gate named, and the stalls the watchdog recorded, from events.jsonl
def health(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What `status` shows: every node the gate named (newest reason), every stall, and why
    snapshots were off (newest reason per job: each worker start of a job says it again)."""
    bad: dict[str, str] = {}
    stalls = []
    off: dict[str, str] = {}
    for e in events:
        if e.get("event") == "preflight":
            bad.update(e.get("bad") or {})
        elif e.get("event") == "stall":
            stalls.append(
                {k: e.get(k) for k in ("time", "job_id", "rank", "host", "last_step", "stacks")}
            )
        elif e.get("event") == "snapshots_off":
            off[str(e.get("job_id"))] = str(e.get("reason"))
    return {
        "bad_nodes": bad,
        "stalls": stalls,
        "snapshots_off": [{"job_id": j, "reason": r} for j, r in off.items()],
    }


def health_lines(info: dict[str, Any]) -> list[str]:
    out = [f"  bad node {name}: {why}" for name, why in info.get("bad_nodes", {}).items()]
    out += [
        f"  stall: rank {s['rank']} on {s['host']} after step {s['last_step']} "
        f"(job {s['job_id']}); "
        f"stacks in {s['stacks']}"
        for s in info.get("stalls", [])
    ]
    out += [
        f"  snapshots off (job {o['job_id']}): {o['reason']}; in-job restarts load the disk "
        "checkpoint"
        for o in info.get("snapshots_off", [])
    ]
    return out


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
