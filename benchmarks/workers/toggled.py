"""train_entry with its in-memory snapshots on and off in alternating segments of the same
processes (the snapshot cost row, benchmarks/snapshot_cost.py).

Why: two process pairs of the same configuration run 3-5% apart here for their whole lives (an
A/A of two `--snapshot.every_steps=0` pairs, interleaved: -0.048 [-0.084..-0.028], 10
repetitions, 2026-12-06), more than the 2% the row asks about. Within one pair the runs share
that bias. Once the auto rule has set its intervals, snapshots are taken as train_entry takes
them in one segment, and not at all in the next (its step boundary returns at once, as it does
when no snapshot is due). A segment is a multiple of the partner's interval of at least
$BENCH_TOGGLE_STEPS steps, so every "on" segment holds the same snapshots; the segments are
written to $BENCH_TOGGLE_LOG: {"segment", "start", "every", "partner_every"}. Segment j (from
0) covers the step boundaries start + j * segment ... + segment - 1, and it is "on" when j is
odd.
"""

from __future__ import annotations

import json
import math
import os
import runpy
import time

from hpctrain.runtime import recovery

_step = recovery.Snapshots.step
_plan: tuple[int, int] | None = None  # (segment, start), once set: one trainer per process


def step(self: recovery.Snapshots, step: int, *, saved: bool) -> None:
    global _plan
    plan = _plan
    if plan is None:
        if self.every is None:  # auto, still measuring its cost
            return _step(self, step, saved=saved)
        unit = self.partner_every or self.every or 1
        seg = unit * math.ceil(int(os.environ.get("BENCH_TOGGLE_STEPS", "24")) / unit)
        plan = _plan = (seg, (step // seg + 1) * seg)
        if self.exchange.rank == 0 and os.environ.get("BENCH_TOGGLE_LOG"):
            with open(os.environ["BENCH_TOGGLE_LOG"], "w") as f:
                json.dump(
                    {
                        "segment": seg,
                        "start": plan[1],
                        "every": self.every,
                        "partner_every": self.partner_every,
                    },
                    f,
                )
    seg, start = plan
    if step < start or (step - start) // seg % 2:
        return _step(self, step, saved=saved)
    self._last = time.perf_counter()
    return None


recovery.Snapshots.step = step  # type: ignore[method-assign]
runpy.run_module("train_entry", run_name="__main__", alter_sys=True)
