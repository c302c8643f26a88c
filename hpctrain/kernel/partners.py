"""Who keeps a copy of whose snapshot, and gloo groups that connect only the pairs they use
(issue 37: a world-wide gloo group connects every pair of ranks, so sockets per rank grew with the
world, and gloo's full mesh fails past about a thousand members).

The partner of a rank is the rank with its local rank on another node: a node of another rack
when the profile names racks (`network.racks`, the job gets it as jobenv.RACKS), else the node N/2
away, so that a rack (a switch, a power feed) lost at once keeps the copies of its ranks. One
function serves the exchange (runtime/recovery.Exchange.put) and the choice of where a restart reads
from (recovery.Exchange.get); torch-free.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator

LAZY = "TORCH_GLOO_LAZY_INIT"  # torch >= 2.8 (pytorch#150801); older torch ignores it


def expand(pattern: str) -> list[str]:
    """A Slurm hostlist (`gpu[001-003,007],login1`) as its host names."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", pattern):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part.strip())
        if m is None:
            out.append(part.strip())
            continue
        head, spans, tail = m.groups()
        for span in spans.split(","):
            lo, _, hi = span.partition("-")
            if int(hi or lo) - int(lo) > 100_000:
                raise ValueError(f"{span}: more than 100000 hosts")
            for n in range(int(lo), int(hi or lo) + 1):
                out += [head + str(n).zfill(len(lo)) + rest for rest in expand(tail) or [""]]
    return [h for h in out if h]


def parse_racks(racks: dict[str, str]) -> list[str]:
    """Every problem of a `network.racks` value (rack name -> hostlist), as one line each."""
    problems, seen = [], dict[str, str]()
    for rack, hosts in racks.items():
        try:
            names = expand(hosts)
        except ValueError:
            names = []
        if not names or "[" in "".join(names) or "]" in "".join(names):
            problems.append(f"rack {rack!r}: {hosts!r} is not a hostlist such as 'gpu[001-064]'")
        both = sorted({seen[h] for h in names if seen.setdefault(h, rack) != rack})
        problems += [f"racks {other!r} and {rack!r} share nodes" for other in both]
    return problems


def rack_of(host: str, racks: str | None) -> str:
    """The rack of `host` (its short name or full name) under the job's racks (JSON: name ->
    hostlist); "" when none is named or the host is in none."""
    if not racks:
        return ""
    try:
        spec = json.loads(racks)
    except ValueError:
        return ""
    short = host.split(".")[0]
    for rack, hosts in sorted(spec.items()):
        names = set(expand(str(hosts)))
        if host in names or short in names:
            return str(rack)
    return ""


def partners(nodes: list[str], racks: list[str]) -> list[int | None]:
    """Per rank (`nodes[r]`, `racks[r]`: rank r's node and its rack), the rank that keeps its copy:
    the same local rank on the node `shift` places further in the nodes ordered by rack (shift =
    half the nodes, or the largest rack's size if larger: then every node's partner is on another
    rack whenever no rack holds more than half the nodes). None on one node, or where that node
    has fewer ranks. A permutation where nodes hold equal rank counts."""
    members: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        members.setdefault(node, []).append(rank)
    order = sorted(members, key=lambda n: (racks[members[n][0]], members[n][0]))
    count = len(order)
    if count < 2:
        return [None] * len(nodes)
    sizes: dict[str, int] = {}
    for node in order:
        sizes[racks[members[node][0]]] = sizes.get(racks[members[node][0]], 0) + 1
    biggest = max(sizes.values()) if len(sizes) > 1 else 0
    shift = max(count // 2, biggest) % count or 1
    out: list[int | None] = [None] * len(nodes)
    for i, node in enumerate(order):
        there = members[order[(i + shift) % count]]
        for j, rank in enumerate(members[node]):
            out[rank] = there[j] if j < len(there) else None
    return out


def sources(partner: list[int | None]) -> list[int | None]:
    """Per rank, the rank whose copy it keeps (the inverse of `partners`)."""
    out: list[int | None] = [None] * len(partner)
    for rank, to in enumerate(partner):
        if to is not None:
            out[to] = rank
    return out


@contextlib.contextmanager
def lazy_gloo() -> Iterator[None]:
    """Gloo groups made inside connect a pair of ranks at its first message (torch >= 2.8), not a
    full mesh at creation: a ring all-reduce or all-gather then holds 2 connections per rank, a
    partner exchange 2, a gather to rank 0 one (rank 0: one per rank). Older torch: the full mesh
    (the variable is not read there)."""
    before = os.environ.get(LAZY)
    os.environ[LAZY] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(LAZY, None)
        else:
            os.environ[LAZY] = before


Source = dict[int, tuple[int, dict[str, object]]]  # rank -> (the rank that reads it, its meta)


def route(
    source: Source,
    held: list[tuple[str, dict[int, dict[int, dict[str, object]]]]],
    step: int,
    partner: list[int | None],
) -> Source:
    """The chosen copies (kernel/snapshot.choose, one reader per node), read where `put` sent
    them: by the rank itself when its node holds it, else by its partner when the partner's node
    does (the pair the exchange connected already), else where `choose` said (another layout)."""
    out = dict(source)
    for rank, (_, meta) in source.items():
        for reader in (rank, partner[rank] if rank < len(partner) else None):
            if reader is None or reader >= len(held):
                continue
            there = held[reader][1].get(rank, {}).get(step)
            if there is not None and there.get("digest") == meta.get("digest"):
                out[rank] = (reader, there)
                break
    return out
