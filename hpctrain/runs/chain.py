"""Chains: a run longer than the site's time limit, as jobs that run one after another.

`submit --time T --chain` with T above `slurm.max_time_min` submits ceil(T / max) segments of the
same job.sh: the first held, each next one `--dependency=afterany:<previous>`, their ids written to
`chain.txt` in the run folder, then the first released. Every segment resumes from the newest
verified checkpoint (train_entry does that at every start). The script's chain block (template)
makes a segment that gets the time-limit warning save and end without requeueing itself, so the
next segment takes over; a segment that finds training complete, or completes it, cancels the
segments after it. `hpctrain status` shows the chain; `cancel` cancels every segment left.

This module plans and reads a chain (from the run folder alone, below hpctrain.runs.folder, which
asks it for a chain's current segment: it reads a run through the Records protocol, never RunDir);
submitting the segments and asking Slurm about them is hpctrain.dispatch.slurm's (submit_chain,
chain_states).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from hpctrain.kernel.errors import UserError
from hpctrain.kernel.values import frozen
from hpctrain.runs.record import Job

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile

KIND = "chain"  # jobs.jsonl kind of a segment


class Records(Protocol):
    """What a chain is read from: a run folder's jobs, starts and events (RunDir has them)."""

    def jobs(self) -> Sequence[Job]: ...

    def restarts(self) -> Sequence[dict[str, object]]: ...

    def events(self) -> Sequence[dict[str, object]]: ...


@frozen
class Segment:
    index: int  # 1-based
    time_min: int
    after: int | None  # the segment it waits for (afterany), or None for the first


def plan(total_min: int, profile: ResolvedProfile) -> list[Segment]:
    """The segments for `--time total_min --chain` under the profile's max_time_min."""
    if profile.scheduler != "slurm":
        raise UserError(
            "--chain needs a Slurm profile: the local executor runs one job at a time "
            "(use --time without --chain, or `hpctrain resume` after it ends)"
        )
    longest = profile.slurm.max_time_min
    if not longest:
        raise UserError(
            f"--chain: profile {profile.name} sets no slurm.max_time_min, so one job can "
            f"run --time {total_min}; drop --chain"
        )
    n = max(1, math.ceil(total_min / longest))
    out = []
    for i in range(1, n + 1):
        left = total_min - (i - 1) * longest
        out.append(Segment(index=i, time_min=min(longest, left), after=i - 1 if i > 1 else None))
    return out


def describe(segments: list[Segment]) -> list[str]:
    lines = []
    for s in segments:
        dep = (
            "held until all are submitted"
            if s.after is None
            else f"--dependency=afterany:<segment {s.after}>"
        )
        lines.append(f"segment {s.index}: --time {s.time_min}, {dep}")
    return lines


def ids(run: Records) -> list[str]:
    """The segments' job ids of the run's newest submission, if it was a chain."""
    out: list[str] = []
    for job in reversed(run.jobs()):
        if job.kind != KIND:
            break
        out.insert(0, job.job_id)
    return out


def current(run: Records, segment_ids: list[str]) -> str:
    """The segment to ask about: the newest that started, or the next one when that one ended its
    part (`segment_end` event); the first when none started yet. Read from the run folder alone."""
    started = [str(r.get("job_id")) for r in run.restarts()]
    ended = {str(e.get("job_id")) for e in run.events() if e.get("event") == "segment_end"}
    now = segment_ids[0]
    for i, job_id in enumerate(segment_ids):
        if job_id in started:
            now = job_id
            if job_id in ended and i + 1 < len(segment_ids):
                now = segment_ids[i + 1]
    return now


def cancel_ids(run: Records) -> list[str]:
    """Every segment from the current one on (cancel stops the whole chain)."""
    seg = ids(run)
    if not seg:
        return []
    return seg[seg.index(current(run, seg)) :]
