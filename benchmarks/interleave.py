"""Interleave long-running jobs by pausing them: every side is started once, warmed up, then
run in turn for a segment of K steps while the others are stopped (SIGSTOP to the whole process
tree, SIGCONT to resume).

Why: on a shared 2-core machine the load changes from one minute to the next. Launching each side
afresh for each repetition costs a torch import and a rendezvous per launch (5-10 s here) and puts
minutes between the sides of one repetition. Segments of the same warm processes, back to back,
cost no start-up and put seconds between A and B, so a load change hits both alike; each
repetition is one segment of every side (the order rotates), and the per-repetition ratio is taken
within it. Only the step intervals that lie wholly inside a segment count (the interval a pause
cut through is dropped), so the paused time never enters a figure.

A side reports progress as one wall-clock completion time per optimizer step: train_entry's
metrics.jsonl (`--train.log_every=1`) or a baseline's $BENCH_PROGRESS file (benchmarks/demo.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import common


@dataclass
class Side:
    name: str
    cmd: list[str]
    progress: Path  # one completion time per step (metrics.jsonl rows or plain lines)
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    times: list[float] = field(default_factory=list)
    _offset: int = 0

    def poll(self) -> int:
        """Read new step times; returns how many steps are done."""
        try:
            with open(self.progress, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return 0
        end = chunk.rfind(b"\n") + 1  # complete lines only
        self._offset += end
        for line in chunk[:end].decode().splitlines():
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                row = json.loads(line)
                if "step" in row and "time" in row:
                    self.times.append(float(row["time"]))
            else:
                self.times.append(float(line))
        return len(self.times)

    def signal(self, sig: int) -> None:
        if self.proc is not None:
            common.kill_tree(self.proc, sig)


def _wait_steps(side: Side, steps: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while side.poll() < steps:
        if side.proc is not None and side.proc.poll() is not None:
            tail = side.log.read_text(errors="replace")[-1500:] if side.log.exists() else ""
            raise common.NotMeasured(
                f"{side.name} exited ({side.proc.returncode}) after "
                f"{len(side.times)} steps, before step {steps}:\n{tail}"
            )
        if time.monotonic() > deadline:
            raise common.NotMeasured(f"{side.name}: step {steps} not reached in {timeout:.0f} s")
        time.sleep(0.01)


def segment_rate(times: list[float], start: float, end: float) -> float | None:
    """1 / the median step interval among the intervals wholly inside [start, end]."""
    inside = [t for t in times if start <= t <= end]
    gaps = [b - a for a, b in zip(inside, inside[1:], strict=False)]
    return 1.0 / common.median(gaps) if len(gaps) >= 3 else None


def segment_mean_rate(times: list[float], start: float, end: float) -> float | None:
    """Steps / seconds over the intervals wholly inside [start, end]: every step counts, also
    the occasional slow one that the median drops (a snapshot every N steps, a save)."""
    inside = [t for t in times if start <= t <= end]
    return (len(inside) - 1) / (inside[-1] - inside[0]) if len(inside) >= 4 else None


def run(
    sides: list[Side],
    *,
    warmup: int,
    segment: int,
    reps: int,
    timeout: float = 300,
    rate: Callable[[list[float], float, float], float | None] = segment_rate,
) -> dict[str, list[float]]:
    """Steps/s of every side in every repetition: {name: [rate per rep]}; `rate` reads one
    segment's (default: the typical rate, 1 / the median interval)."""
    rates: dict[str, list[float]] = {s.name: [] for s in sides}
    try:
        for s in sides:  # start one at a time: start-up is not measured
            s.proc = common.launch(s.cmd, s.log, s.env)
            _wait_steps(s, warmup, timeout)
            s.signal(signal.SIGSTOP)
        for rep in range(reps):
            order = sides[rep % len(sides) :] + sides[: rep % len(sides)]
            for s in order:
                done = s.poll()
                start = time.time()
                s.signal(signal.SIGCONT)
                _wait_steps(s, done + segment, timeout)
                end = time.time()
                s.signal(signal.SIGSTOP)
                got = rate(s.times, start, end)
                if got is None:
                    raise common.NotMeasured(f"{s.name}: too few steps inside segment {rep + 1}")
                rates[s.name].append(got)
    finally:
        for s in sides:
            if s.proc is not None:
                s.signal(signal.SIGKILL)
                s.signal(signal.SIGCONT)
                try:
                    s.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
    return rates
