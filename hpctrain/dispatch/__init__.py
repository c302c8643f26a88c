"""Hand a run's job.sh to its scheduler and ask about it: one entry point per action, whatever the
scheduler (slurm: dispatch/slurm.py, local: dispatch/local.py). submitit is imported only here."""

from __future__ import annotations

import time
from typing import Any, Callable

from hpctrain.runs import TERMINAL, RunDir


def submit(run: RunDir, profile: Any, *, time_min: int, kind: str = "submit") -> str:
    """Submit run.job_sh (already written) and record it in jobs.jsonl; returns the job id."""
    if profile.scheduler == "slurm":
        from hpctrain.dispatch import slurm

        job_id = slurm.submit(run)
    else:
        from hpctrain.dispatch import local

        pre = profile.preemption
        job_id = local.submit(run, time_min=time_min, signal_name=pre.signal, warning_s=pre.warning_s)
    run.add_job(job_id, kind=kind, scheduler=profile.scheduler)
    return job_id


def state(run: RunDir) -> str:
    """PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, PREEMPTED, TIMEOUT, LOST, UNKNOWN, ..."""
    if run.scheduler() == "slurm":
        from hpctrain.dispatch import slurm

        job_id = run.last_job_id()
        return slurm.state(job_id) if job_id else "UNKNOWN"
    from hpctrain.dispatch import local

    return local.state(run)


def cancel(run: RunDir) -> str:
    if run.scheduler() == "slurm":
        from hpctrain.dispatch import slurm

        from hpctrain import chain

        for job_id in chain.cancel_ids(run) or [run.last_job_id()]:  # a chain: every segment left
            if job_id:
                slurm.cancel(job_id)
        return state(run)
    from hpctrain.dispatch import local

    return local.cancel(run)


def wait(run: RunDir, *, poll_s: float | None = None,
         on_change: Callable[[str], None] | None = None,
         on_poll: Callable[[str], None] | None = None) -> str:
    """Block until the run's job ends; returns the final state. on_change: at each new state;
    on_poll: at every poll (progress display)."""
    poll = poll_s or (5.0 if run.scheduler() == "slurm" else 1.0)
    last = None
    while True:
        current = state(run)
        if current != last and on_change:
            on_change(current)
        if on_poll:
            on_poll(current)
        last = current
        if current in TERMINAL:
            return current
        time.sleep(poll)
