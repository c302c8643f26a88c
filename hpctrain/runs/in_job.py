"""In-job restarts of a run, from its `in_job_restart` events (hpctrain/runtime/recovery.py writes one per
restart): what `status` shows apart from requeues (which are starts of the batch script)."""

from __future__ import annotations

from typing import Any


def summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    """{"count", "steps_redone", "time_lost_s", "reasons": {reason: n}} over every job start."""
    found = [e for e in events if e.get("event") == "in_job_restart"]
    reasons: dict[str, int] = {}
    for e in found:
        reasons[str(e.get("reason"))] = reasons.get(str(e.get("reason")), 0) + 1
    return {
        "count": len(found),
        "steps_redone": sum(int(e.get("steps_redone") or 0) for e in found),
        "time_lost_s": round(sum(float(e.get("time_lost_s") or 0) for e in found), 1),
        "reasons": reasons,
    }


def line(s: dict[str, Any]) -> str:
    why = ", ".join(f"{n} {r}" for r, n in sorted(s["reasons"].items()))
    return (
        f"  in-job restarts: {s['count']} ({why + '; ' if why else ''}steps redone "
        f"{s['steps_redone']}, time lost {s['time_lost_s']:g} s)"
    )
