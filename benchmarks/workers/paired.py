"""train_entry and plain loops of the same model in one process pair, in alternating segments
(the training rows, benchmarks/training.py).

    BENCH_PAIRED='{"out": ..., "loops": ["plain_ddp"], "warmup": 6, "segment": 8, "reps": 7,
    "block": 4}' BENCH_TRAIN_ARGS='[...]' torchrun --nproc-per-node 2 \
        -m benchmarks.workers.paired --strategy ddp --run-dir RUN --max-steps N ...

Why: two launches of the same loop run up to 5% apart here for their whole lives (the training
rows' A/A of two plain DDP launches read 1.048 [1.033-1.053] on 2026-12-08, and snapshot_cost.py
met the same bias in 2026-12-06), more than the 2% the rows ask about, and repetitions inside
one launch do not average it away. In one process pair both sides share that bias.

train_entry runs as it always does (its trainer, its loop, its logging, its stop votes); its
`Trainer.train_step` is wrapped so that, at the start of the step where the schedule says so, the
plain loops run their segments first. The schedule (benchmarks/training.schedule): after `warmup` steps of
every side, round -1 (not counted), then `reps` repetitions of `block` rounds, one segment of
`segment` steps per side and round, the order rotating by one each round. Every side's
segment is timed as the start of each of its steps and the end of its last one (its first
step, after the switch, is left out), so a step's interval holds all of it (train_entry's: its
step boundary too: the metrics line, the reduction of the loss and stop votes, the checkpoint
and heartbeat checks). Each rank writes
`out.<rank>.json`: per side and repetition the step intervals and the process CPU seconds.
"""

from __future__ import annotations

import json
import os
import runpy
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from benchmarks.baselines import loops
from benchmarks.training import schedule
from train_entry import trainer

TE = "train_entry"
plan = json.loads(os.environ["BENCH_PAIRED"])
sides = [TE, *plan["loops"]]
steps: dict[str, Callable[[], None]] = {}
# side -> repetition -> {"gaps": [...], "cpu": s}; repetition -1: warm-up and round -1
got: dict[str, dict[int, dict[str, Any]]] = {s: {} for s in sides}
queue = deque(schedule(sides, plan["warmup"], plan["reps"], plan["block"]))
te_left = 0  # train_entry steps left in its current segment
te_marks: list[float] = []
te_cpu = 0.0
te_rep = te_round = -2


def _record(side: str, rep: int, round_: int, marks: list[float], cpu: float) -> None:
    r = got[side].setdefault(rep, {"gaps": [], "odd": [], "cpu": 0.0, "steps": 0})
    # the segment's first step left out: it follows the switch (the other side's memory in the
    # caches, FSDP2's buffers to gather again), a cost of switching, not of either side
    gaps = [b - a for a, b in zip(marks[1:], marks[2:], strict=False)]
    r["gaps"] += gaps
    if round_ % 2:  # the odd rounds' alone: the same side's A/A (odd over all)
        r["odd"] += gaps
    r["cpu"] += cpu
    r["steps"] += len(marks) - 1  # CPU: every step of the segment


def _plain_segments() -> None:
    """Run the plain segments queued before train_entry's next one (its step after them)."""
    global te_left, te_marks, te_cpu, te_rep, te_round
    while queue and queue[0][0] != TE:
        side, rep, round_ = queue.popleft()
        if side not in steps:
            steps[side] = loops.LOOPS[side]()
        n = plan["warmup"] if rep == -2 else plan["segment"]
        cpu, marks = time.process_time(), []
        for _ in range(n):
            marks.append(time.time())
            steps[side]()
        marks.append(time.time())
        _record(side, rep, round_, marks, time.process_time() - cpu)
    if queue:
        _, te_rep, te_round = queue.popleft()
        te_left = plan["warmup"] if te_rep == -2 else plan["segment"]
        te_marks, te_cpu = [], time.process_time()


def _end_te_segment() -> None:
    te_marks.append(time.time())
    _record(TE, te_rep, te_round, te_marks, time.process_time() - te_cpu)


_train_step = trainer.Trainer.train_step


def train_step(self: trainer.Trainer, *args: Any, **kwargs: Any) -> Any:
    global te_left
    if te_left == 0:
        if te_marks:
            _end_te_segment()
        _plain_segments()
    te_marks.append(time.time())
    te_left -= 1
    out = _train_step(self, *args, **kwargs)
    if te_left == 0 and not any(s == TE for s, _, _ in queue):  # train_entry's last segment
        _end_te_segment()
        te_marks.clear()
        _plain_segments()
        rank = os.environ.get("RANK", "0")
        with open(f"{plan['out']}.{rank}.json", "w") as f:
            json.dump({s: {str(k): v for k, v in r.items()} for s, r in got.items()}, f)
    return out


trainer.Trainer.train_step = train_step  # type: ignore[method-assign]
runpy.run_module("train_entry", run_name="__main__", alter_sys=True)
