"""What a run is doing, from its folder: training progress (metrics.jsonl) and its health (bad
nodes, stalls, from events.jsonl). Used by `submit --wait` and `status`; why a run failed is
hpctrain/runs/cause.py.

No torch, no click: plain reads of the run folder, safe on a half-written last line.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.runs import phase, trainer_progress
from hpctrain.runs.folder import RunDir
from hpctrain.runs.trainer_progress import Progress

if TYPE_CHECKING:
    from rich.live import Live  # imported where the live display starts (CLI start-up)

METRICS = "metrics.jsonl"
TAIL_BYTES = 16384  # enough for the last ~40 metric lines; a long run's file is never read whole
WINDOW = 10  # the newest metric lines the live rate and step time are taken over
RATE_LABEL = f" (median, last {WINDOW} steps)"  # `report` says "(median over the run)"


def _tail_rows(path: Path, limit: int = 20) -> list[dict[str, object]]:
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


def lines_from_end(path: Path, block: int = 4096) -> Iterator[bytes]:
    """The lines of a file, the last first, read backwards a block at a time (each block twice
    the one before, up to 1 MiB): the newest line of a 10^6-line metrics.jsonl costs one block.
    The last line may be cut short (a job writing it, or killed): the caller's parse skips it."""
    with path.open("rb") as f:
        end = f.seek(0, 2)
        rest = b""
        while end > 0:
            start = max(0, end - block)
            f.seek(start)
            lines = (f.read(end - start) + rest).split(b"\n")
            end, block = start, min(block * 2, 1 << 20)
            rest = lines.pop(0) if start > 0 else b""  # cut at the block's start: goes on below
            yield from (line for line in reversed(lines) if line.strip())


def _number(value: object) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def snapshot(run: RunDir | Path, total: int | None = None) -> Progress | None:
    """The newest metrics lines' progress, or None before the first step. `total`: max_steps
    when the lines lack it. A script that writes no metrics lines: what its trainer writes
    (trainer_progress), with the file it came from as `source`."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    rows = _tail_rows(run.path / METRICS)
    if not rows:
        return trainer_progress.snapshot(run)
    last = rows[-1]
    step = last["step"]
    assert isinstance(step, int)  # _tail_rows keeps only such rows
    most = last.get("max_steps")
    total = (most if isinstance(most, int) else None) or total
    times = [t for r in rows[-WINDOW:] if (t := _number(r.get("step_time_s"))) is not None]
    step_time = sum(times) / len(times) if times else None
    # a progress line may carry no loss (a callback's step count between two of Trainer's logs)
    loss = next((x for r in reversed(rows) if (x := _number(r.get("loss"))) is not None), None)
    # the median of the newest lines', as `report` takes the median of all (one step's rate swings
    # with a save, a compile or the logging interval: 1847 live against 854 in `report`, issue 34)
    rates = sorted(x for r in rows[-WINDOW:] if (x := _number(r.get("samples_per_s"))) is not None)
    rate = rates[len(rates) // 2] if rates else None
    eta = (total - step) * step_time if total and step_time is not None else None
    at = _number(last.get("time"))
    return Progress(
        step=step,
        total=total,
        loss=loss,
        samples_per_s=_number(rate),
        step_time_s=step_time,
        eta_s=eta,
        age_s=time.time() - at if at is not None else None,
    )


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(max(0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def describe(snap: Progress | None, *, training: bool = True) -> str:
    """One line: `step 40/60  loss 2.112  310 samples/s (median of the last 10 steps)  ETA
    0:00:07`. `training` False (preempted, requeued: the newest line is from before): the step
    and loss only, no rate or ETA of a job that is not training now."""
    if snap is None:
        return "no training step yet"
    parts = [f"step {snap.step}/{snap.total or '?'}"]
    if snap.loss is not None:
        parts.append(f"loss {snap.loss:.4g}")
    if not training:
        return "  ".join(parts)
    if snap.samples_per_s is not None:
        parts.append(f"{snap.samples_per_s:.0f} samples/s{RATE_LABEL if not snap.source else ''}")
    if snap.total:
        parts.append(f"ETA {clock(snap.eta_s)}")
    if snap.source:
        parts.append(f"(from {snap.source})")
    return "  ".join(parts)


# what `status` shows of a run's health (moved from checks/preflight/gate.py): the nodes the
# preflight gate named, and the stalls the watchdog recorded, from events.jsonl
@dataclass(frozen=True)
class Stall:
    """A `stall` event, its fields as the watchdog wrote them."""

    time: object
    job_id: object
    rank: object
    host: object
    last_step: object
    stacks: object


@dataclass(frozen=True)
class SnapshotsOff:
    job_id: str
    reason: str


@dataclass(frozen=True)
class Health:
    bad_nodes: dict[str, object]  # node: the gate's newest reason
    stalls: list[Stall]
    snapshots_off: list[SnapshotsOff]  # why in-memory snapshots were off, per job

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def health(events: Sequence[dict[str, object]]) -> Health:
    """What `status` shows: every node the gate named (newest reason), every stall, and why
    snapshots were off (newest reason per job: each worker start of a job says it again)."""
    bad: dict[str, object] = {}
    stalls = []
    off: dict[str, str] = {}
    fields = [f.name for f in dataclasses.fields(Stall)]
    for e in events:
        if e.get("event") == "preflight":
            named = e.get("bad") or {}
            if isinstance(named, dict):
                bad.update(named)
        elif e.get("event") == "stall":
            stalls.append(Stall(**{k: e.get(k) for k in fields}))
        elif e.get("event") == "snapshots_off":
            off[str(e.get("job_id"))] = str(e.get("reason"))
    return Health(
        bad_nodes=bad,
        stalls=stalls,
        snapshots_off=[SnapshotsOff(job_id=j, reason=r) for j, r in off.items()],
    )


def health_lines(h: Health) -> list[str]:
    out = [f"  bad node {name}: {why}" for name, why in h.bad_nodes.items()]
    out += [
        f"  stall: rank {s.rank} on {s.host} after step {s.last_step} (job {s.job_id}); "
        f"stacks in {s.stacks}"
        for s in h.stalls
    ]
    out += [
        f"  snapshots off (job {o.job_id}): {o.reason}; in-job restarts load the disk checkpoint"
        for o in h.snapshots_off
    ]
    return out


# ---------------------------------------------------------------- following a run
class Follower:
    """Called with the job state at every poll of `submit --wait`: on a terminal one live line
    (rich), else one line a minute and at every state change."""

    def __init__(
        self,
        run: RunDir | Path,
        *,
        total: int | None = None,
        every_s: float = 60.0,
        live: bool | None = None,
        out: Callable[[str], None] | None = None,
    ) -> None:
        self.run = run if isinstance(run, RunDir) else RunDir(run)
        self.total, self.every_s = total, every_s
        self.out = out or (lambda s: print(s, file=sys.stderr, flush=True))
        self.live_mode = sys.stderr.isatty() if live is None else live
        self.last_state: str | None = None
        self.last_print = 0.0
        self.live: Live | None = None

    def line(self, state: str) -> str:
        return self._line(state)[1]

    def _line(self, state: str) -> tuple[str, str]:
        """(the state shown, the line): a preemption and its requeue as the run folder tells
        them, before the scheduler does (hpctrain/runs/phase.py)."""
        snap = snapshot(self.run, self.total)
        seen = time.time() - snap.age_s if snap is not None and snap.age_s is not None else None
        now = phase.of(self.run, state, last_metric_time=seen)
        text = f"{time.strftime('%H:%M:%S')} {now.state}" + (f" ({now.note})" if now.note else "")
        shown = describe(snap, training=not now.stale) if snap is not None else ""
        return now.state + (now.note or ""), text + ("  " + shown if shown else "")

    def __call__(self, state: str) -> None:
        shown, text = self._line(state)
        changed = shown != self.last_state
        self.last_state = shown
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
