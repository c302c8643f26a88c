"""In-job restarts, seen from the workers (`preemption.max_in_job_restarts`; hpctrain/kernel/fatal.py).

A worker that dies, stalls or times out is restarted inside the job: torchrun's agent starts the
group again (`--max-restarts`, TORCHELASTIC_RESTART_COUNT), or the batch shell starts a new srun
step (launcher srun, IN_JOB_RESTART). Every start resumes from the newest verified checkpoint by
itself. This module adds what a restart needs on top:

- (train_entry/cli.py, before torch) a worker started again after an error that repeats (the FATAL
  file) or after a stop was asked (the STOP file) leaves at once: kernel/fatal.refused_start.
- `agreed_restart`: whether this start is a restart. One all-reduce MAX at start: a torchrun agent
  that restarts its node's workers because another node's failed counts no restart of its own.
- `record`: rank 0 writes one `in_job_restart` event per restart: its number in this job start,
  why (a stall, else a failed worker), the step resumed from, the step reached before the failure
  (the newest metrics.jsonl line), the steps redone, the seconds from that step to the resume
  (`down_s`) and the time lost (`down_s` plus the redone steps at the last step time).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.kernel import fatal, jobenv, layout
from hpctrain.kernel.files import read_jsonl
from hpctrain.kernel.rundir import RunFolder


def agreed_restart(device: torch.device) -> int:
    """The largest restart count of any rank (0: the first start). A collective, once per start."""
    mine = fatal.restarts()
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    t = torch.tensor([mine], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


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


def record(run_dir: Path, *, resumed: int) -> dict[str, object]:
    """Rank 0, at a restart's resume: the `in_job_restart` event (and the stall's marker moved to
    its stacks, so the batch shell does not requeue a stall this restart already handled)."""
    job, start = jobenv.get(jobenv.JOB_ID), int(jobenv.get(jobenv.RESTART_COUNT) or 0)
    folder = RunFolder(run_dir)
    before = [
        e
        for e in read_jsonl(run_dir / layout.EVENTS)
        if e.get("event") == "in_job_restart"
        and str(e.get("job_id")) == str(job)
        and e.get("restart_count") == start
    ]
    reason = "worker failed"
    stalled = run_dir / layout.STALLED
    if stalled.exists():
        reason = "stall"
        keep = run_dir / layout.STACKS / f"{job or 'local'}-{start}"
        keep.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            shutil.move(stalled, keep / f"{layout.STALLED}-{len(before) + 1}")
    last = _last_step(run_dir)
    # metrics are logged one step late (stepsync): a save of the step after the newest line counts
    reached = max(int(last["step"]) if last else resumed, resumed)
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
        source="train_entry",
    )
