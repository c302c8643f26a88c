"""What a run did and cost: plain numbers from RunData (and sacct where the run was on Slurm)."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

from hpctrain.report.data import Checkpoint, RunData, Segment
from hpctrain.runs import phase
from hpctrain.runs.in_job import summary as in_job_summary
from hpctrain.runs.phase import timestamp

END_EVENTS = ("done", "failed", "timeout")


@dataclass(frozen=True)
class Restart:
    """Where training stopped and where it resumed."""

    after_step: int
    resumed_at: int
    steps_redone: int
    seconds_lost: float | None  # the gap, less one typical step
    in_job: bool  # an in-job restart (its event lies in the gap), not a new start of the job


@dataclass(frozen=True)
class Summary:
    """What a run did and cost (`report --json`: these keys, in this order)."""

    name: str
    path: str
    steps: int | None
    max_steps: int | None
    loss_first: float | None
    loss_last: float | None
    samples_per_s_median: float | None
    wall_s: float | None
    gpu_hours: float | None
    gpu_hours_source: str | None
    nodes: int | None
    gpus_per_node: int | None
    starts: int
    jobs: int
    restarts: int  # the count `status` shows (hpctrain/runs/phase.py); details: restart_details
    steps_redone: int
    restart_seconds_lost: float
    # from the events: a restart that resumed from the step it reached splits no stretch
    in_job_restarts: int
    steps_redone_in_job: int
    in_job_seconds_lost: float
    restart_details: list[Restart]
    saves: int
    save_seconds_blocked: float
    newest_checkpoint: Checkpoint | None
    mesh: dict[str, object] | None


def _sacct_gpu_hours(job_ids: list[str]) -> float | None:
    """Sum over every attempt (-D: requeues too) of elapsed seconds x allocated GPUs, from sacct."""
    if not job_ids:
        return None
    try:
        out = subprocess.run(
            [
                "sacct",
                "-X",
                "-D",
                "-n",
                "-P",
                "-j",
                ",".join(job_ids),
                "-o",
                "JobID,ElapsedRaw,AllocTRES",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    total = 0.0
    for line in out.stdout.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        tres = dict(kv.split("=", 1) for kv in parts[2].split(",") if "=" in kv)
        gpus = tres.get("gres/gpu", "0")
        total += int(parts[1]) * (int(gpus) if gpus.isdigit() else 0) / 3600
    return total


def summarize(rd: RunData, *, sacct: bool = True) -> Summary:
    rows = rd.metrics
    first, last = (rows[0], rows[-1]) if rows else (None, None)
    wall = _wall(rd)
    restarts = _restarts(rd)
    jobs = in_job_summary(rd.events)
    gpu_hours, source = None, None
    if rd.scheduler == "slurm" and sacct:
        gpu_hours = _sacct_gpu_hours([j.job_id for j in rd.jobs])
        source = "sacct" if gpu_hours is not None else None
    if gpu_hours is None and wall is not None:
        gpu_hours = wall * rd.world / 3600
        source = "estimate: wall time x nodes x GPUs" + (
            "" if rd.scheduler == "slurm" else " (local: CPU workers)"
        )
    outside = [r for r in restarts if not r.in_job]  # the in-job ones count from their events
    return Summary(
        name=rd.name,
        path=str(rd.path),
        steps=last.step if last else None,
        max_steps=last.max_steps if last else None,
        loss_first=first.loss if first else None,
        loss_last=last.loss if last else None,
        samples_per_s_median=rows.middle("samples_per_s"),
        wall_s=wall,
        gpu_hours=gpu_hours,
        gpu_hours_source=source,
        nodes=rd.nodes,
        gpus_per_node=rd.gpus,
        starts=len(rd.starts),
        jobs=len(rd.jobs),
        restarts=phase.restarts(rd.start_lines, rd.jobs, rd.events),
        steps_redone=sum(r.steps_redone for r in outside),
        restart_seconds_lost=sum((max(0.0, r.seconds_lost or 0.0) for r in outside), 0.0),
        in_job_restarts=jobs.count,
        steps_redone_in_job=jobs.steps_redone,
        in_job_seconds_lost=jobs.time_lost_s,
        restart_details=restarts,
        saves=len(rd.saves),
        save_seconds_blocked=sum(s.blocked_s for s in rd.saves),
        newest_checkpoint=rd.checkpoints[-1] if rd.checkpoints else None,
        mesh=rd.mesh,
    )


def _wall(rd: RunData) -> float | None:
    """From the first start to the last event or metric line; up to now while it runs."""
    segs = rd.segments
    times = [t for t in rd.starts if t is not None]
    ends = [t for t in (timestamp(e.get("time")) for e in rd.events) if t is not None]
    ends += [m.time for m in rd.metrics[-1:] if m.time is not None]
    finished = any(e.get("event") in END_EVENTS for e in rd.events[-1:])
    start = min(times) if times else (segs[0].start_time if segs else None)
    end = max(ends) if ends else None
    if not finished and start is not None:
        end = max(end or 0.0, time.time())  # still running (or killed): up to now
    return (end - start) if start is not None and end is not None else None


def _restarts(rd: RunData) -> list[Restart]:
    """Every place training resumed: the steps it did again and the time it lost."""
    typical = rd.metrics.middle("step_time_s") or 0.0
    # an in-job restart's event is written at its resume, between the two stretches it separates
    in_job = [
        t
        for t in (timestamp(e.get("time")) for e in rd.events if e.get("event") == "in_job_restart")
        if t is not None
    ]
    out = []
    for prev, nxt in zip(rd.segments, rd.segments[1:], strict=False):
        resumed = nxt.first_step - 1
        gap = (
            nxt.start_time - prev.end_time - typical
            if nxt.start_time is not None and prev.end_time is not None
            else None
        )
        out.append(
            Restart(
                after_step=prev.last_step,
                resumed_at=resumed,
                steps_redone=max(0, prev.last_step - resumed),
                seconds_lost=gap,
                in_job=any(_between(t, prev, nxt) for t in in_job),
            )
        )
    return out


def _between(t: float, prev: Segment, nxt: Segment) -> bool:
    if prev.end_time is None or nxt.start_time is None:
        return False
    return prev.end_time - 1 <= t <= nxt.start_time + 1  # event times are whole seconds


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _num(x: float | None, fmt: str = ".4g") -> str:
    return "?" if x is None else format(x, fmt)


def text(s: Summary) -> str:
    ck = s.newest_checkpoint
    newest = f"step {ck.step} ({ck.path})" if ck else "none"
    trained = (
        f"step {s.steps}/{s.max_steps or '?'}, "
        f"loss {_num(s.loss_first)} -> {_num(s.loss_last)}, "
        f"{_num(s.samples_per_s_median, '.0f')} samples/s (median over the run)"
        if s.steps is not None
        else "no training step in metrics.jsonl"
    )
    mesh = s.mesh
    pipe = (
        f", {mesh['schedule']} with {mesh.get('microbatches')} microbatches"
        if mesh and mesh.get("schedule")
        else ""
    )
    lines = [
        f"{s.name}: {trained}",
        *([f"  layout: {mesh.get('mesh')} ({mesh.get('strategy')}{pipe})"] if mesh else []),
        f"  wall time {_clock(s.wall_s)} on {s.nodes} node(s) x {s.gpus_per_node}; "
        f"GPU-hours {_num(s.gpu_hours, '.3f')} ({s.gpu_hours_source})",
        f"  restarts {s.restarts} ({s.starts} start(s), {s.jobs} submission(s)); "
        f"steps redone {s.steps_redone}; "
        f"time lost to restarts {_clock(s.restart_seconds_lost)}",
        f"  in-job restarts {s.in_job_restarts}; steps redone {s.steps_redone_in_job}; "
        f"time lost {_clock(s.in_job_seconds_lost)}",
        f"  checkpoints saved {s.saves}, loop blocked {s.save_seconds_blocked:.2f} s; "
        f"newest: {newest}",
    ]
    return "\n".join(lines)
