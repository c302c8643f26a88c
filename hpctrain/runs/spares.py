"""Hot spares of a run (`preemption.spare_nodes`), from its `spare_swapped` events (the preflight
gate writes one per node swapped for a spare) and the newest gate verdict: what `status` shows,
the nodes swapped out and the spares left in the newest job start."""

from __future__ import annotations

from typing import Any

from hpctrain.kernel.fatal import SPARE_SWAPPED

FIELDS = ("time", "job_id", "restart_count", "out", "in", "when", "reason", "spares_left")


def summary(
    events: list[dict[str, Any]],
    *,
    asked: int,
    newest_start: dict[str, Any] | None,
    verdict: dict[str, Any] | None,
) -> dict[str, Any]:
    """{"asked", "swaps": [{out, in, when, ...}], "left"}: `left` is for the newest job start (a
    requeued job gets a fresh allocation with its spares again): the newest gate verdict's spares
    when it is of that start, else all of them. `left` is None for a run without spares."""
    swaps = [{k: e.get(k) for k in FIELDS} for e in events if e.get("event") == SPARE_SWAPPED]
    left: int | None = None
    if asked:
        left = asked

        def same(rec: dict[str, Any] | None) -> bool:
            return bool(
                rec
                and newest_start
                and str(rec.get("job_id")) == str(newest_start.get("job_id"))
                and rec.get("restart_count") == newest_start.get("restart_count")
            )

        if verdict is not None and same(verdict) and verdict.get("train"):
            left = len(verdict.get("spares_left") or [])
        mine = [s for s in swaps if same(s)]
        last = mine[-1].get("spares_left") if mine else None
        if isinstance(last, int):
            left = min(left, last)
    return {"asked": asked, "swaps": swaps, "left": left}


def lines(s: dict[str, Any]) -> list[str]:
    """`status` lines: the spares and every node swapped out (none for a run without spares)."""
    if not s.get("asked") and not s.get("swaps"):
        return []
    out = [f"  hot spares: {s['left']} of {s['asked']} left (job's newest start)"]
    for w in s["swaps"]:
        when = "at the start" if w.get("when") == "start" else "after a failed training step"
        out.append(
            f"  spare swap: {w['out']} out, {w['in']} in, {when} (job {w['job_id']}; "
            f"{w.get('spares_left')} spare(s) left then): {w.get('reason')}"
        )
    return out
