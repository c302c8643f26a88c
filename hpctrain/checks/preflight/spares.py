"""Hot spares in the preflight verdict (`preemption.spare_nodes`; gate.py runs this): which spare
takes a bad training node's place, and the `spare_swapped` event of each swap (`status` reads
it: hpctrain/runs/spares.py).

The nodes checked are the training nodes and the spares left (`gate.py --train ... --spare-nodes
K`); a bad training node is swapped for a good spare (verdict `swap`), a bad spare is dropped.
Only when the good spares cannot replace every bad training node does the usual verdict follow
(shrink, requeue or fail, over the good training nodes and every good spare; a requeued job asks
for its spares again)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from hpctrain.kernel.fatal import SPARE_SWAPPED
from hpctrain.kernel.rundir import RunFolder


@dataclass
class Placement:
    """Hot spares: where training goes once the bad nodes are out (`place`)."""

    train: list[str]  # the training nodes, in the allocation's order
    spares_left: list[str]
    swapped: list[tuple[str, str]]  # (bad training node, the spare in its place)
    short: list[str]  # bad training nodes no good spare could replace


def place(names: list[str], train: list[str], spares: list[str], bad: dict[str, str]) -> Placement:
    """Swap each bad training node for a good spare, in order; bad spares are dropped. `names`:
    the checked nodes in the allocation's order (the head, node 0, is the first training node)."""
    good_spares = [s for s in spares if s not in bad]
    out = [t for t in train if t in bad]
    swapped = list(zip(out, good_spares, strict=False))
    used = {s for _, s in swapped}
    keep = {t for t in train if t not in bad} | used
    order = {n: i for i, n in enumerate(names)}
    return Placement(
        train=sorted(keep, key=lambda n: order.get(n, len(order))),
        spares_left=[s for s in good_spares if s not in used],
        swapped=swapped,
        short=out[len(swapped) :],
    )


def settled(spots: Placement, bad: dict[str, str]) -> tuple[str, str] | None:
    """(action, reason) when the spares cover every bad training node (`swap`, or `ok` when only
    spares were bad); None when some stays unreplaced (the gate's usual verdict follows)."""
    if spots.short:
        return None
    reason = "; ".join(
        [f"swapping {o} for the spare {i}: {bad[o]}" for o, i in spots.swapped]
        + [f"dropping the spare {n}: {bad[n]}" for n in bad if n not in spots.train]
    )
    return ("swap" if spots.swapped else "ok"), reason


def record(
    run_dir: Path,
    swapped: list[tuple[str, str]],
    bad: dict[str, str],
    *,
    when: str,
    job_id: str | None,
    restart_count: int,
    train: list[str],
    left: int,
) -> None:
    """One `spare_swapped` event per node swapped out, and a line for the batch log."""
    for out, spare in swapped:
        RunFolder(run_dir).event(
            SPARE_SWAPPED,
            job_id=job_id,
            restart_count=restart_count,
            out=out,
            **{"in": spare},
            reason=bad[out],
            when=when,
            nodes=train,
            spares_left=left,
        )
        print(f"hpctrain: preflight: spare {spare} replaces {out}", file=sys.stderr)
