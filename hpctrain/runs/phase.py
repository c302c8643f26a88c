"""Restarts, counted one way for `status`, `runs`, `report` and `submit --wait`, and what a run
is doing while its scheduler has not caught up with a preemption.

Restarts: every start of the batch script after the first (restarts.jsonl), a requeue or a
`resume`, each one training resumed from a checkpoint, less the planned starts of a chain's later
segments; plus one as soon as a requeue is known (its `requeue` event) and its start has not come
yet. In-job restarts (torchrun's, without a new start of the script) are counted apart
(hpctrain/runs/in_job.py).

The phase (issue 34): after a rank saved and left with exit 75, the job still reads RUNNING until
every node has left (a user script's c10d store can take 60 s), and then PENDING; the run folder
knows sooner. So while the scheduler says the job is queued or running, the newest start's
events decide what `status` and `--wait` show:
  signal (not a cancel TERM) RUNNING, "preemption signal USR2: saving at the next step"
  preempted / PREEMPTED file PREEMPTED, "saved step 132; leaving, the requeue follows"
  requeue                    REQUEUED, "preempted; saved step 132; waiting to start again"
  a new start, no metrics yet RUNNING, "started again: loading the checkpoint, no step yet"

No torch, no click: reads of the run folder only.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpctrain.kernel import layout, states
from hpctrain.runs import chain
from hpctrain.runs.folder import RunDir
from hpctrain.runs.record import Job

# events after which nothing of the attempt before is pending (a `resume` queues a new job)
ENDS = ("done", "failed", "timeout", "cancel", "segment_end", "resume")


def timestamp(value: object) -> float | None:
    """Seconds since the epoch from a number or an ISO time ('...Z' or with an offset)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, str):
        return None
    try:
        t = _dt.datetime.fromisoformat(value)  # Python >= 3.11 reads 'Z' and '+0000' itself
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.UTC)
    return t.timestamp()


def since_newest_start(
    starts: Sequence[Mapping[str, object]], events: Sequence[Mapping[str, object]]
) -> list[Mapping[str, object]]:
    """The events written after the newest start of the script (all of them before the first).
    Times are whole seconds: an event in the start's own second belongs to the attempt before
    (a local requeue starts again at once)."""
    begun = timestamp(starts[-1].get("time")) if starts else None
    if begun is None:
        return list(events) if not starts else []
    return [e for e in events if (t := timestamp(e.get("time"))) is not None and t > begun]


def requeue_pending(events_after_start: Sequence[Mapping[str, object]]) -> bool:
    """A requeue was written after the newest start, and nothing ended the run after it."""
    pending = False
    for e in events_after_start:
        if e.get("event") == "requeue":
            pending = True
        elif e.get("event") in ENDS:
            pending = False
    return pending


def restarts(
    starts: Sequence[Mapping[str, object]],
    jobs: Sequence[Job],
    events: Sequence[Mapping[str, object]],
) -> int:
    """How often training started again after it stopped (module docstring): the one count."""
    segments = {j.job_id for j in jobs if j.kind == chain.KIND}
    again = 0
    for before, start in zip(starts, starts[1:], strict=False):
        planned = (
            str(start.get("job_id")) in segments
            and start.get("job_id") != before.get("job_id")
            and not start.get("restart_count")
        )
        again += 0 if planned else 1
    return again + requeue_pending(since_newest_start(starts, events))


@dataclass(frozen=True)
class Phase:
    """What to show for a run: `state` (the scheduler's unless the run folder knows better) and
    one line saying why it differs (None: as the scheduler says)."""

    state: str
    note: str | None = None

    @property
    def stale(self) -> bool:
        """The newest progress line is from before the preemption: no rate or ETA to show."""
        return (self.note is not None and self.state != states.RUNNING) or self.note == _RESTARTED


_RESTARTED = "started again: loading the checkpoint, no step yet"


def phase(
    scheduler_state: str,
    starts: Sequence[Mapping[str, object]],
    events: Sequence[Mapping[str, object]],
    *,
    marker: bool = False,
    last_metric_time: float | None = None,
) -> Phase:
    """The run's phase (module docstring). `marker`: the PREEMPTED file exists (a rank left 75
    under launcher srun); `last_metric_time`: the newest metrics line's time."""
    if scheduler_state not in states.LIVE or scheduler_state == states.PENDING and not starts:
        return Phase(scheduler_state)
    after = since_newest_start(starts, events)
    saved = next((e.get("step") for e in reversed(after) if e.get("event") == "preempted"), None)
    at = f"saved step {saved}" if isinstance(saved, int) else "saved its checkpoint"
    if requeue_pending(after):
        why = next(e.get("reason") for e in reversed(after) if e.get("event") == "requeue")
        cause = f"{why}; {at}" if why and why != "preempted" else f"preempted; {at}"
        return Phase(states.REQUEUED, f"{cause}; waiting to start again")
    if any(e.get("event") in ENDS for e in after):
        return Phase(scheduler_state)
    if saved is not None or marker:
        return Phase(states.PREEMPTED, f"{at}; leaving, the requeue follows")
    signal = next(
        (
            e.get("signal")
            for e in reversed(after)
            if e.get("event") == "signal"
            and (e.get("signal") != "TERM" or e.get("as") == "preemption")
        ),
        None,
    )
    if signal is not None:
        return Phase(scheduler_state, f"preemption signal {signal}: saving at the next step")
    begun = timestamp(starts[-1].get("time")) if len(starts) > 1 else None
    if (
        scheduler_state == states.RUNNING
        and begun is not None
        and last_metric_time is not None
        and last_metric_time < begun
    ):
        return Phase(scheduler_state, _RESTARTED)
    return Phase(scheduler_state)


def of(run: RunDir, scheduler_state: str, *, last_metric_time: float | None = None) -> Phase:
    """phase() of a run folder."""
    if scheduler_state not in states.LIVE:
        return Phase(scheduler_state)  # nothing to read
    return phase(
        scheduler_state,
        run.restarts(),
        run.events(),
        marker=(run.path / layout.PREEMPTED).exists(),
        last_metric_time=last_metric_time,
    )
