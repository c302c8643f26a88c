"""What a run did and cost: plain numbers from RunData (and sacct where the run was on Slurm)."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from hpctrain.report.data import RunData, timestamp
from hpctrain.runs.in_job import summary as in_job_summary

END_EVENTS = ("done", "failed", "timeout")


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


def summarize(rd: RunData, *, sacct: bool = True) -> dict[str, Any]:
    rows = rd.metrics
    first = rows[0] if rows else {}
    last = rows[-1] if rows else {}
    segs = rd.segments
    times = [t for t in (timestamp(s.get("time")) for s in rd.starts) if t is not None]
    ends = [t for t in (timestamp(e.get("time")) for e in rd.events) if t is not None]
    ends += [t for t in (timestamp(r.get("time")) for r in rows[-1:]) if t is not None]
    finished = any(e.get("event") in END_EVENTS for e in rd.events[-1:])
    start = min(times) if times else (segs[0].start_time if segs else None)
    end = max(ends) if ends else None
    if not finished and start is not None:
        end = max(end or 0.0, time.time())  # still running (or killed): up to now
    wall = (end - start) if start is not None and end is not None else None

    redone, lost = 0, 0.0
    step_times = [r["step_time_s"] for r in rows if isinstance(r.get("step_time_s"), (int, float))]
    typical = sorted(step_times)[len(step_times) // 2] if step_times else 0.0
    restarts = []
    # an in-job restart's event is written at its resume, between the two stretches it separates
    in_job = [
        t
        for t in (timestamp(e.get("time")) for e in rd.events if e.get("event") == "in_job_restart")
        if t is not None
    ]
    for prev, nxt in zip(segs, segs[1:], strict=False):
        resumed = nxt.first_step - 1
        again = max(0, prev.last_step - resumed)
        gap = (
            nxt.start_time - prev.end_time - typical
            if nxt.start_time is not None and prev.end_time is not None
            else None
        )
        inside = any(
            prev.end_time is not None
            and nxt.start_time is not None
            and prev.end_time - 1 <= t <= nxt.start_time + 1  # event times are whole seconds
            for t in in_job
        )
        if not inside:  # the in-job ones are counted from their events, below
            redone += again
            lost += max(0.0, gap or 0.0)
        restarts.append(
            {
                "after_step": prev.last_step,
                "resumed_at": resumed,
                "steps_redone": again,
                "seconds_lost": gap,
                "in_job": inside,
            }
        )
    blocked = sum(float(s.get("blocked_s") or 0) for s in rd.saves)
    jobs = in_job_summary(rd.events)

    job_ids = [str(j["job_id"]) for j in rd.jobs if j.get("job_id")]
    gpu_hours, source = None, None
    if rd.scheduler == "slurm" and sacct:
        gpu_hours = _sacct_gpu_hours(job_ids)
        source = "sacct" if gpu_hours is not None else None
    if gpu_hours is None and wall is not None:
        gpu_hours = wall * rd.world / 3600
        source = "estimate: wall time x nodes x GPUs" + (
            "" if rd.scheduler == "slurm" else " (local: CPU workers)"
        )
    rates = [r["samples_per_s"] for r in rows if isinstance(r.get("samples_per_s"), (int, float))]
    newest = rd.checkpoints[-1] if rd.checkpoints else None
    return {
        "name": rd.name,
        "path": str(rd.path),
        "steps": last.get("step"),
        "max_steps": last.get("max_steps"),
        "loss_first": first.get("loss"),
        "loss_last": last.get("loss"),
        "samples_per_s_median": sorted(rates)[len(rates) // 2] if rates else None,
        "wall_s": wall,
        "gpu_hours": gpu_hours,
        "gpu_hours_source": source,
        "nodes": rd.request.get("nodes"),
        "gpus_per_node": rd.request.get("gpus"),
        "starts": len(rd.starts),
        "jobs": len(rd.jobs),
        "restarts": sum(1 for r in restarts if not r["in_job"]),
        "steps_redone": redone,
        "restart_seconds_lost": lost,
        # from the events: a restart that resumed from the step it reached splits no stretch
        "in_job_restarts": jobs["count"],
        "steps_redone_in_job": jobs["steps_redone"],
        "in_job_seconds_lost": jobs["time_lost_s"],
        "restart_details": restarts,
        "saves": len(rd.saves),
        "save_seconds_blocked": blocked,
        "newest_checkpoint": newest,
        "mesh": rd.mesh,
    }


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _num(x: Any, fmt: str = ".4g") -> str:  # Any: a JSON value of any type
    return format(x, fmt) if isinstance(x, (int, float)) else "?"


def text(s: dict[str, Any]) -> str:
    ck = s["newest_checkpoint"]
    newest = f"step {ck['step']} ({ck['path']})" if ck else "none"
    trained = (
        f"step {s['steps']}/{s['max_steps'] or '?'}, "
        f"loss {_num(s['loss_first'])} -> {_num(s['loss_last'])}, "
        f"{_num(s['samples_per_s_median'], '.0f')} samples/s (median)"
        if s["steps"] is not None
        else "no training step in metrics.jsonl"
    )
    mesh = s.get("mesh")
    pipe = (
        f", {mesh['schedule']} with {mesh['microbatches']} microbatches"
        if mesh and mesh.get("schedule")
        else ""
    )
    lines = [
        f"{s['name']}: {trained}",
        *([f"  layout: {mesh['mesh']} ({mesh['strategy']}{pipe})"] if mesh else []),
        f"  wall time {_clock(s['wall_s'])} on {s['nodes']} node(s) x {s['gpus_per_node']}; "
        f"GPU-hours {_num(s['gpu_hours'], '.3f')} ({s['gpu_hours_source']})",
        f"  restarts {s['restarts']} ({s['starts']} start(s), {s['jobs']} submission(s)); "
        f"steps redone {s['steps_redone']}; "
        f"time lost to restarts {_clock(s['restart_seconds_lost'])}",
        f"  in-job restarts {s['in_job_restarts']}; steps redone {s['steps_redone_in_job']}; "
        f"time lost {_clock(s['in_job_seconds_lost'])}",
        f"  checkpoints saved {s['saves']}, loop blocked {s['save_seconds_blocked']:.2f} s; "
        f"newest: {newest}",
    ]
    return "\n".join(lines)
