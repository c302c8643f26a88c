"""3. Restart: time from process start to the first resumed step, over the time to the first step of
a fresh start plus the checkpoint's load time (target <= 1.2).

Per repetition: a fresh run (torchrun, 2 ranks, DDP, the demo GPT) of N steps saves a checkpoint at
its end; the same command with more steps then resumes from it. Both times run from the launch of
torchrun to the metrics.jsonl timestamp of the first step that run completed. The load time is the
one train_entry's Checkpointer reports for that resume ("resumed from ... in X s" in train.log).
So the ratio is 1.0 when resuming costs nothing beyond reading the checkpoint (0.97-1.04 through
2026-12-06: 4 repetitions hold the spread far from the target). restart_noise_fresh_twice
(stated): each repetition's fresh start over the one before it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from benchmarks import common
from benchmarks.training import TRAIN_ARGS

LOADED = re.compile(r"resumed from \S+ .*? in ([0-9.]+)\s*s")


def train_entry(run_dir: Path, steps: int, every: int) -> list[str]:
    return [
        *common.torchrun(2),
        "-m",
        "train_entry",
        "--strategy",
        "ddp",
        "--run-dir",
        str(run_dir),
        "--max-steps",
        str(steps),
        "--checkpoint-every",
        str(every),
        *TRAIN_ARGS,
    ]


def first_step_s(run_dir: Path, steps: int, every: int, skip_rows: int) -> tuple[float, int, int]:
    """Launch, wait, return (seconds from launch to the first completed step, that step, rows)."""
    t0 = time.time()
    common.run(train_entry(run_dir, steps, every), timeout=600)
    rows = common.read_jsonl(run_dir / "metrics.jsonl")
    new = rows[skip_rows:]
    if not new:
        raise common.NotMeasured(f"no metrics rows from the run in {run_dir}")
    return new[0]["time"] - t0, new[0]["step"], len(rows)


def run(quick: bool) -> list[common.Row]:
    name, target = "restart_first_step_vs_fresh_plus_load", "<= 1.2"
    noise = "restart_noise_fresh_twice"
    reps, n = (3, 4) if quick else (4, 4)
    reps = common.reps(reps)
    fresh, resumed, load, ratios = [], [], [], []
    try:
        for _ in range(reps):
            d = common.scratch("restart-")
            f_s, f_step, rows = first_step_s(d, n, n, 0)
            r_s, r_step, _ = first_step_s(d, n + 2, n, rows)
            if f_step != 1 or r_step != n + 1:
                raise common.NotMeasured(
                    f"expected steps 1 and {n + 1} first, got {f_step} and {r_step}"
                )
            m = LOADED.findall((d / "train.log").read_text())
            if not m:
                raise common.NotMeasured(f"{d}/train.log has no 'resumed from ... in X s' line")
            fresh.append(f_s)
            resumed.append(r_s)
            load.append(float(m[-1]))
            ratios.append(r_s / (f_s + load[-1]))
    except common.NotMeasured as e:
        return [common.not_measured(n, t, str(e)) for n, t in ((name, target), (noise, "-"))]
    f, r, ld = common.median(fresh), common.median(resumed), common.median(load)
    return [
        common.settle(
            name,
            ratios,
            target,
            train_args=TRAIN_ARGS,
            steps_before_restart=n,
            reps=reps,
            fresh_first_step_s=fresh,
            resumed_first_step_s=resumed,
            load_s=load,
            summary=f"launch to first resumed step {r:.2f} s; launch to first fresh step {f:.2f} s "
            f"+ checkpoint load {ld:.2f} s",
        ),
        common.noise(
            noise,
            common.successive(fresh),
            "launch to the first step of a fresh start, each repetition's over the one before it",
            fresh_first_step_s=fresh,
        ),
    ]
