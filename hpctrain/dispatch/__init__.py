"""Hand a run's job.sh to its scheduler and ask about it, whatever the scheduler.

A scheduler is one module with a `SCHEDULER` object that has the four methods of `Scheduler`;
the registry is hpctrain/kernel/plugins.py's SCHEDULERS (a new scheduler: one module plus one line
there). submitit is imported only in dispatch/, its private
parts only in dispatch/submitit_api.py.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

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


@runtime_checkable
class Batched(Protocol):
    """A scheduler that answers for many runs at once (Slurm: issue 37, flat in the number of runs)."""

    def states(self, runs: list[RunDir]) -> dict[RunDir, str]:
        """Each run's state() from one batched question (a broken run left out)."""

    def cancel_many(self, runs: list[RunDir]) -> dict[RunDir, str]:
        """cancel() of every run with one call; the states after."""


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


def states(runs: Sequence[RunDir]) -> dict[RunDir, str]:
    """Many runs' states with one batched question per scheduler that can batch (Slurm: one
    sacct, at most one scontrol, whatever the number of runs); a run whose folder cannot be read
    is left out (state() says why, one run at a time)."""
    by: dict[str, list[RunDir]] = {}
    for run in runs:
        try:
            by.setdefault(run.scheduler(), []).append(run)
        except Exception:  # noqa: BLE001 - a broken folder: its own state() raises the reason
            continue
    out: dict[RunDir, str] = {}
    for name, group in by.items():
        sched = scheduler(name)
        if isinstance(sched, Batched) and len(group) > 1:
            out.update(sched.states(group))
            continue
        for run in group:  # one run: one question either way
            try:
                out[run] = state(run)
            except Exception:  # noqa: BLE001 - as above
                continue
    return out


def cancel_many(runs: Sequence[RunDir]) -> dict[RunDir, str]:
    """cancel() of every run, one scancel for all where the scheduler can; the states after."""
    by: dict[str, list[RunDir]] = {}
    for run in runs:
        by.setdefault(run.scheduler(), []).append(run)
    out: dict[RunDir, str] = {}
    for name, group in by.items():
        sched = scheduler(name)
        if isinstance(sched, Batched) and len(group) > 1:
            out.update(sched.cancel_many(group))
        else:
            out.update((run, cancel(run)) for run in group)
    return out


def cancel(run: RunDir) -> str:
    return scheduler(run.scheduler()).cancel(run)


def signal(run: RunDir, name: str) -> str:
    return scheduler(run.scheduler()).signal(run, name)


def delay(polls: int, base: float, cap: float) -> float:
    """Seconds to the next question after `polls` answers in a row that changed nothing."""
    return float(min(base * 2**polls, cap))


def schedule(base: float, cap: float, until_s: float) -> list[float]:
    """When a state is asked (seconds from the start) while nothing changes, up to `until_s`."""
    times, polls, now = [], 0, 0.0
    while now <= until_s:
        times.append(now)
        now += delay(polls, base, cap)
        polls += 1
    return times


# the run folder's own files that change when the job's state does, sooner than sacct says so
_WATCHED = (layout.EVENTS, layout.RESTARTS, layout.JOBS, layout.CHAIN, layout.BATCH_LOG)


class Poll:
    """When to ask the scheduler about a run again: `base` s after a change, doubling while the
    answers stay the same, up to `cap` s (Slurm: ~1 question a minute after the first minute).
    A change of the state or of the run folder's own files (events, starts, submissions, the batch
    log: stat()s only) starts again at `base`, and asks at once once `base` s have passed."""

    def __init__(self, run: RunDir, base: float, cap: float) -> None:
        self.run, self.base, self.cap = run, base, cap
        self.polls, self.last, self.next_at = 0, float("-inf"), 0.0
        self.seen = self._marks()
        self.touched = False
        self.asked = 0  # questions so far (the bench counts them)

    def _marks(self) -> tuple[tuple[int, int] | None, ...]:
        out: list[tuple[int, int] | None] = []
        for name in _WATCHED:
            try:
                st = (self.run.path / name).stat()
            except OSError:
                out.append(None)
                continue
            out.append((st.st_size, st.st_mtime_ns))
        return tuple(out)

    def due(self, now: float) -> bool:
        marks = self._marks()
        if marks != self.seen:
            self.seen, self.touched = marks, True
        return now >= self.next_at or (self.touched and now >= self.last + self.base)

    def answered(self, now: float, changed: bool) -> None:
        self.polls = 0 if changed or self.touched else self.polls + 1
        self.touched, self.last, self.asked = False, now, self.asked + 1
        self.next_at = now + (
            self.base if self.polls == 0 else delay(self.polls, self.base, self.cap)
        )


def poll_for(run: RunDir, poll_s: float | None) -> Poll:
    """Slurm: 5 s backing off to 60 s; local (a file read): every second; poll_s: fixed."""
    if poll_s:
        return Poll(run, poll_s, poll_s)
    return Poll(run, 5.0, 60.0) if run.scheduler() == "slurm" else Poll(run, 1.0, 1.0)


def wait(
    run: RunDir,
    *,
    poll_s: float | None = None,
    on_change: Callable[[str], None] | None = None,
    on_poll: Callable[[str], None] | None = None,
) -> str:
    """Block until the run's job ends; returns the final state. on_change: at each new state;
    on_poll: at every poll (progress display; at least every `base` s between questions)."""
    poll = poll_for(run, poll_s)
    tick = min(1.0, poll.base)
    last: str | None = None
    shown = float("-inf")
    while True:
        now = time.monotonic()
        if poll.due(now):
            current = state(run)
            poll.answered(now, current != last)
            if current != last and on_change:
                on_change(current)
            last = current
            if on_poll:
                on_poll(current)
                shown = now
            if current in TERMINAL:
                return current
        elif on_poll and last is not None and now - shown >= poll.base:
            on_poll(last)
            shown = now
        time.sleep(tick)
