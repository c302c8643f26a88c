"""In-job restarts of a run, from its `in_job_restart` events (hpctrain/runtime/recovery.py writes one per
restart): what `status` shows apart from requeues (which are starts of the batch script)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class InJob:
    """Every in-job restart over every job start."""

    count: int
    steps_redone: int
    time_lost_s: float
    reasons: dict[str, int]  # reason: how many times


def summary(events: Sequence[dict[str, object]]) -> InJob:
    found = [e for e in events if e.get("event") == "in_job_restart"]
    reasons: dict[str, int] = {}
    for e in found:
        reasons[str(e.get("reason"))] = reasons.get(str(e.get("reason")), 0) + 1
    return InJob(
        count=len(found),
        steps_redone=sum(int(_number(e.get("steps_redone"))) for e in found),
        time_lost_s=round(sum(_number(e.get("time_lost_s")) for e in found), 1),
        reasons=reasons,
    )


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float | str) and value else 0.0


def line(s: InJob) -> str:
    why = ", ".join(f"{n} {r}" for r, n in sorted(s.reasons.items()))
    return (
        f"  in-job restarts: {s.count} ({why + '; ' if why else ''}steps redone "
        f"{s.steps_redone}, time lost {s.time_lost_s:g} s)"
    )
