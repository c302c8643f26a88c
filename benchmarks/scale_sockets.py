"""Sockets per rank at 4 / 8 / 16 ranks (issue 37: they grew 17 -> 65 from 4 to 16 ranks with
snapshots and async saves, and a 60-file limit failed at 16).

A real CPU world per size (benchmarks/workers/sockets.py: gloo, 2 ranks per simulated node,
snapshots exchanged with the partners and restored from them, one async checkpoint save). Counted:
socket fds in /proc/<pid>/fd of each rank after that, minus those after init_process_group (the
job's default group and its store, which the job has without hpctrain's features). The figure is
the growth exponent (log-log slope over the sizes) of the mean over ranks 1..N-1; rank 0 is DCP's
coordinator (it gathers every rank's plan: one socket per rank) and is stated on its own row, as is
the largest non-zero rank (gloo's tree broadcast gives a rank up to log2 N peers).

    python -m benchmarks.run --only scale_sockets --quick   # 4 and 8 ranks (full: 16 too)
"""

from __future__ import annotations

import json
import math
import os
from statistics import mean

from benchmarks import common

RANK_MIB = 400  # one forked rank's resident memory, about (torch, gloo, DCP)


def slope(sizes: list[int], counts: list[float]) -> float:
    """The least-squares slope of log(count) on log(size)."""
    xs, ys = [math.log(s) for s in sizes], [math.log(max(c, 1e-9)) for c in counts]
    mx, my = mean(xs), mean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def fits(ranks: int) -> bool:
    """The machine holds `ranks` forked ranks: memory, and at most 8 ranks per core."""
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
    return free > ranks * RANK_MIB and ranks <= 8 * (os.cpu_count() or 1)


def run(quick: bool) -> list[common.Row]:
    sizes = [4, 8] if quick or not fits(16) else [4, 8, 16]
    target = "<= 0.1"
    name = "scale_sockets_per_rank_exponent"
    try:
        p = common.run(
            [common.PY, "-m", "benchmarks.workers.sockets", *map(str, sizes)], timeout=600
        )
    except common.NotMeasured as e:
        return [common.not_measured(name, target, str(e))]
    worlds = {d["world"]: d["rows"] for d in map(json.loads, p.stdout.splitlines())}
    others = [mean(r["added"] for r in worlds[n][1:]) for n in sizes]
    top = [max(r["added"] for r in worlds[n][1:]) for n in sizes]
    first = [worlds[n][0]["added"] for n in sizes]
    details: dict[str, object] = {
        "sizes": sizes,
        "counted": "socket fds in /proc/<pid>/fd after the exchange, a restore and an async "
        "save, minus those after init_process_group",
        "per_rank": {str(n): [r["added"] for r in worlds[n]] for n in sizes},
        "exchange_only": {str(n): sorted({r["phases"]["get"] for r in worlds[n]}) for n in sizes},
        "default_group": {str(n): [r["base"] for r in worlds[n]] for n in sizes},
        "restored": all(r["restored"] for n in sizes for r in worlds[n]),
        "mean_ranks_1_to_n": [round(c, 2) for c in others],
        "max_ranks_1_to_n": top,
        "rank_0": first,
        "before_issue_37": "17 / 49 / 65 sockets per rank at 16 ranks (none / snapshots / both)",
    }
    exchange = [mean(r["phases"]["get"] for r in worlds[n]) for n in sizes]
    return [
        common.measured(name, slope(sizes, others), target, **details),
        common.measured(
            "scale_sockets_exchange_exponent",
            slope(sizes, exchange),
            target,
            exchange_only=details["exchange_only"],
            sizes=sizes,
        ),
        common.result(
            "scale_sockets_busiest_rank_exponent",
            slope(sizes, top),
            "stated (log2 N: gloo's tree broadcast in DCP's save)",
            None,
            max_ranks_1_to_n=top,
            sizes=sizes,
        ),
        common.result(
            "scale_sockets_rank0_exponent",
            slope(sizes, first),
            "stated (one per rank: the plan gather)",
            None,
            rank_0=first,
            sizes=sizes,
        ),
    ]
