"""The `in_job_restart` event (docs/recovery.md): rank 0 writes one per in-job restart, from
train_entry or the runtime's Checkpoint.load: its number, why (a stall, a node swapped for a spare,
else a failed worker), the step resumed from and the one reached before the failure
(metrics.jsonl), the steps redone, the seconds from that step to the resume (`down_s`) and the time
lost. No torch: whether this start is a restart is agreed in recovery.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path

from hpctrain.kernel import jobenv, layout
from hpctrain.kernel.fatal import SPARE_SWAPPED
from hpctrain.kernel.files import read_jsonl
from hpctrain.kernel.rundir import RunFolder


def _last_step(run_dir: Path) -> dict[str, float] | None:
    """The newest metrics line with a step (the tail of metrics.jsonl: the file grows all run)."""
    try:
        with open(run_dir / layout.METRICS, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict) and isinstance(row.get("step"), int) and "time" in row:
                return row
    return None


def record(run_dir: Path, *, resumed: int, source: str) -> dict[str, object]:
    """Rank 0, at a restart's resume: the `in_job_restart` event (`source`: train_entry, runtime;
    the stall's marker moved to its stacks, so the batch shell does not requeue a stall this
    restart already handled)."""
    job, start = jobenv.get(jobenv.JOB_ID), int(jobenv.get(jobenv.RESTART_COUNT) or 0)
    folder = RunFolder(run_dir)
    mine = [
        e
        for e in read_jsonl(run_dir / layout.EVENTS)
        if e.get("event") in ("in_job_restart", SPARE_SWAPPED)
        and str(e.get("job_id")) == str(job)
        and e.get("restart_count") == start
    ]
    before = [e for e in mine if e.get("event") == "in_job_restart"]
    # a hot spare swapped in since the restart before (the gate's event): the step that failed
    # was a node's, not only a worker's
    reason = (
        "node swapped for a spare"
        if mine and mine[-1]["event"] == SPARE_SWAPPED
        else "worker failed"
    )
    stalled = run_dir / layout.STALLED
    hung_at = 0  # a stall's marker names the last step the hung rank completed
    if stalled.exists():
        reason = "stall"
        with contextlib.suppress(OSError, ValueError, AttributeError):
            hung_at = int(json.loads(stalled.read_text()).get("last_step") or 0)
        keep = run_dir / layout.STACKS / f"{job or 'local'}-{start}"
        keep.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            shutil.move(stalled, keep / f"{layout.STALLED}-{len(before) + 1}")
    last = _last_step(run_dir)
    # metrics are logged one step late (stepsync): a save of the step after the newest line counts
    reached = max(int(last["step"]) if last else resumed, resumed, hung_at)
    redone = max(0, reached - resumed)
    down = max(0.0, time.time() - float(last["time"])) if last else 0.0
    step_s = float(last.get("step_time_s") or 0.0) if last else 0.0
    return folder.event(
        "in_job_restart",
        job_id=job,
        restart_count=start,
        restart=len(before) + 1,
        reason=reason,
        resumed_step=resumed,
        reached_step=reached,
        steps_redone=redone,
        down_s=round(down, 3),
        time_lost_s=round(down + redone * step_s, 3),
        source=source,
    )
