"""How the nodes of a gate agree who joins the all-reduce, with filesystem calls per node that do
not grow with the node count (issue 37: every node polled every node's report every 0.2 s, ~47k
stats per node at 1,024 nodes).

Node 0 lists the gate's folder once per poll and reads each report once, when it appears (O(N)
reads on node 0 only, once), then writes MEMBERS; every other node polls that one file. Polls back
off (50 ms, x1.5, at most 0.5 s apart), so their number depends on how long a node waits, not on
how many nodes there are. Stdlib only (node.py runs it before the network part imports torch).
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from hpctrain.checks.preflight import MEMBERS, NODE_FAILURE, NODE_REPORT, Member, Members, NodeJson

Clock = Callable[[], float]
Sleep = Callable[[float], None]


def member(r: NodeJson) -> Member:
    return {"node": r["node"], "name": r["name"], "addr": r["addr"], "port": r["port"]}


def backoff(first: float = 0.05, cap: float = 0.5) -> Iterator[float]:
    """Poll intervals: quick at first (the nodes finish their local checks together), then at
    most `cap` apart, so a wait of W seconds is ~6 + W / cap polls whatever the node count."""
    wait = first
    while True:
        yield wait
        wait = min(cap, wait * 1.5)


def read_own(path: Path) -> bytes | None:
    """A file of the gate's folder, or None when it is absent, a link, or another account's (the
    run folder is private, issue 33; what another account could have written is never trusted)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode):
            return None
        return f.read()


def gather(
    out: Path,
    nnodes: int,
    deadline: float,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> dict[int, NodeJson | None]:
    """Node 0: every node's local report (None: its checks could not run, `fail-<id>.txt`); the
    nodes missing at the deadline are absent."""
    reports = {NODE_REPORT.format(node=n): n for n in range(nnodes)}
    failures = {NODE_FAILURE.format(node=n): n for n in range(nnodes)}
    got: dict[int, NodeJson | None] = {}
    for wait in backoff():
        with os.scandir(out) as listing:
            present = [e.name for e in listing]
        for name in present:
            if name in reports and got.get(reports[name]) is None:
                data = read_own(out / name)
                if data is not None:
                    got[reports[name]] = json.loads(data)
            elif name in failures and failures[name] not in got:
                got[failures[name]] = None
        if len(got) == nnodes or clock() >= deadline:
            return got
        sleep(wait)
    raise AssertionError("backoff() never ends")


def wait_members(
    out: Path,
    deadline: float,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> Members | None:
    """Every node but 0: node 0's member list; None when it did not come by the deadline, or node
    0 could not run (its `fail-0.txt`, looked for once a poll, ends the wait early)."""
    gone = out / NODE_FAILURE.format(node=0)
    for wait in backoff():
        data = read_own(out / MEMBERS)
        if data is not None:
            published: Members = json.loads(data)
            return published
        if os.path.lexists(gone) or clock() >= deadline:
            return None
        sleep(wait)
    raise AssertionError("backoff() never ends")
