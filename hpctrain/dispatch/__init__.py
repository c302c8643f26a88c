"""Hand a run's job.sh to its scheduler and ask about it, whatever the scheduler.

A scheduler is one module with a `SCHEDULER` object that has the four methods of `Scheduler`;
the registry is hpctrain/kernel/plugins.py's SCHEDULERS (a new scheduler: one module plus one line
there). submitit is imported only in dispatch/, its private
parts only in dispatch/submitit_api.py.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

from hpctrain.kernel import layout
from hpctrain.kernel.plugins import SCHEDULERS
from hpctrain.runs.folder import TERMINAL, RunDir

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile


class Scheduler(Protocol):
    def submit(self, run: RunDir, profile: ResolvedProfile, *, time_min: int) -> str:
        """Queue run.job_sh (already written); the job id."""

    def state(self, run: RunDir) -> str:
        """PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, PREEMPTED, TIMEOUT, LOST, UNKNOWN, ..."""

    def cancel(self, run: RunDir) -> str:
        """Stop the run's job (the run folder stays); the state after."""

    def signal(self, run: RunDir, name: str) -> str:
        """Send signal `name` (USR2, TERM, ...) to the run's batch script; says what was signalled."""


def mark_cancel(run: RunDir, job_id: str) -> None:
    """Say in the run folder that `hpctrain cancel` stops job `job_id`, before the signal: under
    preemption.signal TERM the batch shell reads it to tell a cancel from a preemption."""
    try:
        before = run.file(layout.CANCEL).read_text()
    except FileNotFoundError:
        before = ""
    run.write(layout.CANCEL, f"{before}{job_id}\n")


def scheduler(name: str) -> Scheduler:
    return cast("Scheduler", importlib.import_module(SCHEDULERS[name]).SCHEDULER)


def submit(run: RunDir, profile: ResolvedProfile, *, time_min: int, kind: str = "submit") -> str:
    """Submit run.job_sh (already written) and record it in jobs.jsonl; returns the job id."""
    job_id = scheduler(profile.scheduler).submit(run, profile, time_min=time_min)
    run.add_job(job_id, kind=kind, scheduler=profile.scheduler)
    return job_id


def state(run: RunDir) -> str:
    return scheduler(run.scheduler()).state(run)


def cancel(run: RunDir) -> str:
    return scheduler(run.scheduler()).cancel(run)


def signal(run: RunDir, name: str) -> str:
    return scheduler(run.scheduler()).signal(run, name)


def wait(
    run: RunDir,
    *,
    poll_s: float | None = None,
    on_change: Callable[[str], None] | None = None,
    on_poll: Callable[[str], None] | None = None,
) -> str:
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
