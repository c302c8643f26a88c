"""The state of a job or of one array element, from whatever records sacct keeps.

sacct's `--parsable2` lines (`JobID|State|...`, a header first) name a job three ways:
  43          a plain job, or an array whose tasks are all still pending (before the split)
  43_0        one array element (after a requeue, `-D` lists each of its attempts)
  43_[0-2]    a range record: the tasks still pending in the array's meta record. Slurm 22.05's
              database can keep the range it had at submission on that record, so once the last
              pending task is cancelled, `43_[0-2] CANCELLED` names elements that are running or
              done (seen on a loaded machine: issue 20).
An element's own records therefore win over any range that names it; a range decides only for an
element with no record of its own, and then as a guess that the controller may overrule (`RANGE`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from hpctrain.kernel.states import REQUEUED

_RANGE = re.compile(r"^(\d+)_\[([0-9,\-]+)(?:%\d+)?\]\Z")
_ELEMENT = re.compile(r"^(\d+)_(\d+)\Z")


@dataclass(frozen=True)
class Found:
    """What sacct says about one job id: its state, and how sure that is ("element", "job":
    a record of its own; "range": only a range record names it)."""

    state: str
    source: str


def indexes(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def records(text: str) -> list[tuple[str, str]]:
    """(JobID, State) of every job record in `sacct --parsable2` output, steps left out, in
    sacct's order (attempts of a requeued job oldest first)."""
    lines = text.splitlines()
    if not lines:
        return []
    names = lines[0].split("|")
    if "JobID" not in names or "State" not in names:
        return []
    i, s = names.index("JobID"), names.index("State")
    out = []
    for line in lines[1:]:
        cols = line.split("|")
        if len(cols) <= max(i, s):
            continue
        job_id, state = cols[i].strip(), cols[s].strip()
        if job_id and "." not in job_id:  # 43_0.batch, 43.0: steps, not jobs
            out.append((job_id, state))
    return out


def _latest(states: list[str]) -> str:
    """The current attempt's state: the newest record that is not an attempt's REQUEUED stub."""
    live = [s for s in states if s.split()[0] != REQUEUED]
    return (live or states)[-1]


def find(text: str, job_id: str) -> Found | None:
    """What the sacct output `text` says about `job_id` ("43" or "43_1"); None: nothing."""
    return index(text, [job_id]).get(job_id)


def index(text: str, job_ids: Iterable[str]) -> dict[str, Found]:
    """find() for many ids over one listing, reading it once (a 1,000-point sweep's listing is
    read once, not once per point); an id sacct says nothing about is left out."""
    own: dict[str, list[str]] = {}
    ranges: dict[str, list[tuple[set[int], str]]] = {}  # array id -> (its indexes, state)
    for jid, state in records(text):
        own.setdefault(jid, []).append(state)
        if m := _RANGE.match(jid):
            ranges.setdefault(m.group(1), []).append((set(indexes(m.group(2))), state))
    out: dict[str, Found] = {}
    for job_id in job_ids:
        element = _ELEMENT.match(job_id)
        if job_id in own:
            out[job_id] = Found(_latest(own[job_id]), "element" if element else "job")
        elif element:
            n = int(element.group(2))
            ranged = [state for idx, state in ranges.get(element.group(1), []) if n in idx]
            if ranged:
                out[job_id] = Found(_latest(ranged), "range")
    return out


# ids per sacct call: ~8 KB of `-j` argument, far below the kernel's 128 KiB for one argument
CHUNK = 1000
FIELDS = "JobID,State,NodeList"


def commands(job_ids: Iterable[str]) -> list[list[str]]:
    """The sacct calls that list every job in `job_ids`: an array element is asked by its array's
    id (one id lists every element and range record), CHUNK ids a call; -X: allocations only
    (steps would be dropped by records() anyway)."""
    asked = sorted({j.split("_")[0] for j in job_ids if j})
    return [
        ["sacct", "-X", "-o", FIELDS, "--parsable2", "-j", ",".join(asked[i : i + CHUNK])]
        for i in range(0, len(asked), CHUNK)
    ]
