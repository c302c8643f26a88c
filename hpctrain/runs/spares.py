"""Hot spares of a run (`preemption.spare_nodes`), from its `spare_swapped` events (the preflight
gate writes one per node swapped for a spare) and the newest gate verdict: what `status` shows,
the nodes swapped out and the spares left in the newest job start."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpctrain.kernel.fatal import SPARE_SWAPPED


@dataclass(frozen=True)
class Swap:
    """A `spare_swapped` event, its fields as the gate wrote them."""

    time: object
    job_id: object
    restart_count: object
    out: object  # the node swapped out
    into: object  # the spare swapped in (the event's "in")
    when: object  # start, or training (after a failed training step)
    reason: object
    spares_left: object

    def to_json(self) -> dict[str, object]:
        return {
            "time": self.time,
            "job_id": self.job_id,
            "restart_count": self.restart_count,
            "out": self.out,
            "in": self.into,
            "when": self.when,
            "reason": self.reason,
            "spares_left": self.spares_left,
        }


@dataclass(frozen=True)
class Spares:
    asked: int
    swaps: list[Swap]
    left: int | None
    """Spares left in the newest job start (a requeued job gets a fresh allocation with its
    spares again); None for a run without spares."""

    def to_json(self) -> dict[str, object]:
        return {"asked": self.asked, "swaps": [s.to_json() for s in self.swaps], "left": self.left}


def _swap(e: Mapping[str, object]) -> Swap:
    return Swap(
        time=e.get("time"),
        job_id=e.get("job_id"),
        restart_count=e.get("restart_count"),
        out=e.get("out"),
        into=e.get("in"),
        when=e.get("when"),
        reason=e.get("reason"),
        spares_left=e.get("spares_left"),
    )


def summary(
    events: Sequence[Mapping[str, object]],
    *,
    asked: int,
    newest_start: Mapping[str, object] | None,
    verdict: Mapping[str, object] | None,
) -> Spares:
    """The spares asked for, every swap, and the spares left: the newest gate verdict's when it is
    of the newest start, else all of them, less what that start's swaps used."""
    swaps = [_swap(e) for e in events if e.get("event") == SPARE_SWAPPED]
    left: int | None = None
    if asked:
        left = asked

        def same(job_id: object, restart_count: object) -> bool:
            return bool(
                newest_start
                and str(job_id) == str(newest_start.get("job_id"))
                and restart_count == newest_start.get("restart_count")
            )

        if verdict is not None and verdict.get("train"):
            if same(verdict.get("job_id"), verdict.get("restart_count")):
                spare = verdict.get("spares_left")
                left = len(spare) if isinstance(spare, list | tuple | dict | str) else 0
        mine = [s for s in swaps if same(s.job_id, s.restart_count)]
        last = mine[-1].spares_left if mine else None
        if isinstance(last, int):
            left = min(left, last)
    return Spares(asked=asked, swaps=swaps, left=left)


def lines(s: Spares) -> list[str]:
    """`status` lines: the spares and every node swapped out (none for a run without spares)."""
    if not s.asked and not s.swaps:
        return []
    out = [f"  hot spares: {s.left} of {s.asked} left (job's newest start)"]
    for w in s.swaps:
        when = "at the start" if w.when == "start" else "after a failed training step"
        out.append(
            f"  spare swap: {w.out} out, {w.into} in, {when} (job {w.job_id}; "
            f"{w.spares_left} spare(s) left then): {w.reason}"
        )
    return out
