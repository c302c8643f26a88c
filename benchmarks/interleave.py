"""Interleave long-running jobs by pausing them: every side is started once, warmed up, then
run in turn for short segments of K steps while the others are stopped (SIGSTOP to the whole
process tree, SIGCONT to resume).

Why: on a shared 2-core machine the load changes from one minute to the next. Launching each side
afresh for each repetition costs a torch import and a rendezvous per launch (5-10 s here) and puts
minutes between the sides of one repetition. Segments of the same warm processes, back to back,
cost no start-up and put seconds between A and B, so a load change hits both alike.

A repetition is `block` rounds; a round is one segment of every side, the order rotating from one
round to the next. A side's rate in a repetition is read from the step intervals of all its
segments in it together (1 / their median by default): many short segments in alternation
rather than one long one each, so a drift of the load lands on both sides, and the per-repetition
ratio rests on ~block x K intervals. Only the intervals that lie wholly inside a segment count
(the interval a pause cut through is dropped), so the paused time never enters a figure. One
round before the first repetition is run and not counted (the first segment after a long pause).

The same side twice: each side's even rounds against its odd ones in every repetition
(`Measured.same_launch`), and, where a group launches one side twice, the two launches
(`Measured.ratios`): what the method reads where nothing differs.

A side reports progress as one wall-clock completion time per optimizer step: train_entry's
metrics.jsonl (`--train.log_every=1`) or a baseline's $BENCH_PROGRESS file (benchmarks/demo.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import common

Window = tuple[float, float]  # (start, end) of one segment, wall-clock seconds


@dataclass
class Side:
    name: str
    cmd: list[str]
    progress: Path  # one completion time per step (metrics.jsonl rows or plain lines)
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    times: list[float] = field(default_factory=list)
    tree: list[int] = field(default_factory=list)  # its processes, once warm (see `signal`)
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
        """To the whole process tree: the one found once warm (a scan of /proc at every pause
        would cost the 2 cores CPU in the middle of the segments), else a fresh scan."""
        if not self.tree:
            if self.proc is not None:
                common.kill_tree(self.proc, sig)
            return
        for pid in self.tree:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


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


def intervals(times: list[float], windows: Sequence[Window]) -> list[float]:
    """The step intervals wholly inside one of the windows (never one across a pause)."""
    out = []
    for start, end in windows:
        inside = [t for t in times if start <= t <= end]
        out += [b - a for a, b in zip(inside, inside[1:], strict=False)]
    return out


def typical_rate(times: list[float], windows: Sequence[Window]) -> float | None:
    """1 / the median step interval inside the windows: robust to the stalls other processes
    cause on a shared machine (a step that waits for a descheduled peer)."""
    gaps = intervals(times, windows)
    return 1.0 / common.median(gaps) if len(gaps) >= 3 else None


Rate = Callable[[list[float], Sequence[Window]], float | None]


@dataclass
class Measured:
    """Every side's step times and its segments, per repetition."""

    times: dict[str, list[float]]
    windows: dict[str, list[list[Window]]]  # side -> repetition -> its segments, in order
    rate: Rate = typical_rate

    def _rate(self, name: str, windows: Sequence[Window]) -> float:
        got = self.rate(self.times[name], windows)
        if got is None:
            raise common.NotMeasured(f"{name}: too few steps inside a repetition's segments")
        return got

    def rates(self, name: str) -> list[float]:
        """The side's steps/s in each repetition."""
        return [self._rate(name, w) for w in self.windows[name]]

    def ratios(self, a: str, b: str) -> list[float]:
        """A's steps/s over B's, per repetition."""
        return [x / y for x, y in zip(self.rates(a), self.rates(b), strict=True)]

    def same_launch(self, name: str) -> list[float]:
        """The side's odd rounds over its even ones, per repetition: the A/A of one launch."""
        return [self._rate(name, w[1::2]) / self._rate(name, w[0::2]) for w in self.windows[name]]


def run(
    sides: list[Side],
    *,
    warmup: int,
    segment: int,
    reps: int,
    block: int,
    timeout: float = 300,
    rate: Rate = typical_rate,
) -> Measured:
    """Launch every side, warm it up, then `reps` repetitions of `block` rounds of `segment`
    steps per side (see the module's docstring)."""
    windows: dict[str, list[list[Window]]] = {s.name: [[] for _ in range(reps)] for s in sides}
    try:
        for s in sides:  # start one at a time: start-up is not measured
            s.proc = common.launch(s.cmd, s.log, s.env)
            _wait_steps(s, warmup, timeout)
            s.signal(signal.SIGSTOP)
            s.tree = [*common.descendants(s.proc.pid), s.proc.pid]
        for i in range(-1, reps * block):  # round -1: not counted
            k = i % len(sides)
            for s in sides[k:] + sides[:k]:
                done = s.poll()
                start = time.time()
                s.signal(signal.SIGCONT)
                _wait_steps(s, done + segment, timeout)
                end = time.time()
                s.signal(signal.SIGSTOP)
                if i >= 0:
                    windows[s.name][i // block].append((start, end))
    finally:
        for s in sides:
            s.tree = []  # a fresh scan: everything below it
            if s.proc is not None:
                s.signal(signal.SIGKILL)
                s.signal(signal.SIGCONT)
                try:
                    s.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
    return Measured({s.name: s.times for s in sides}, windows, rate)
