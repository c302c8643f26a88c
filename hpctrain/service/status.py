"""What `status` and `runs` show: one row per run, and one run in detail (reading only)."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain import dispatch
from hpctrain.kernel import layout, states
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.rundir import UnsafeRun
from hpctrain.runs import in_job, phase, spares, sweepdir
from hpctrain.runs.cause import Cause, root_cause
from hpctrain.runs.folder import TERMINAL, find_run
from hpctrain.runs.in_job import InJob
from hpctrain.runs.progress import Health, health, snapshot
from hpctrain.runs.record import BrokenRun
from hpctrain.runs.spares import Spares
from hpctrain.runs.trainer_progress import Progress
from hpctrain.service import points

if TYPE_CHECKING:
    from collections.abc import Sequence

    from hpctrain.runs.folder import RunDir

BROKEN = "BROKEN"  # the state of a run whose folder cannot be read as a run
# states in which nothing failed (yet): no root cause to look for
_NOT_FAILED = (states.COMPLETED, states.RUNNING, states.PENDING, states.UNKNOWN, states.REQUEUED)


@dataclass(frozen=True, kw_only=True)
class Summary:
    """One run's row of `runs` and `status` (`--json`: these keys, in this order)."""

    name: str
    state: str
    """The scheduler's state, or what the run folder knows sooner (hpctrain/runs/phase.py):
    PREEMPTED while the job still runs after a save and exit 75, REQUEUED until it starts again."""
    job_id: str | None
    scheduler: str | None
    profile: str | None
    nodes: int | None
    gpus_per_node: int | None
    strategy: str | None
    """Its strategy, or the kind of its own entry (script, module), which has none of ours."""
    mesh: str | None
    """The layout of the newest start, as train_entry wrote it ("dp 2 x tp 2")."""
    restarts: int
    """Training started again after it stopped (a requeue, from its event on, or a resume); the
    count `report` shows too (hpctrain/runs/phase.py)."""
    starts: int
    checkpoint_step: int | None
    created: str | None
    path: str
    reason: str | None
    """Why it failed (or, BROKEN, why its folder cannot be read)."""
    scheduler_state: str | None = None
    """The scheduler's own state (differs from `state` while it has not caught up)."""
    phase: str | None = None
    """Why `state` differs from the scheduler's, in one line (None: it does not)."""

    def to_json(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Summary)}


@dataclass(frozen=True, kw_only=True)
class Detail(Summary):
    """`status RUN`: the row, and what happened to the run."""

    history: list[dict[str, object]]
    """Every start of the script (restarts.jsonl, as written)."""
    jobs: list[dict[str, object]]
    """Every submission (jobs.jsonl, as written)."""
    chain: list[dict[str, str]]
    """A chain's segments: job_id and state of each, in order (empty: no chain)."""
    progress: Progress | None
    root_cause: Cause | None
    health: Health
    in_job_restarts: InJob
    """In-job restarts, apart from requeues (`restarts`)."""
    spares: Spares

    def to_json(self) -> dict[str, object]:
        out = super().to_json() | {"history": self.history, "jobs": self.jobs}
        if self.chain:
            out["chain"] = self.chain
        return out | {
            "progress": self.progress.to_json() if self.progress else None,
            "root_cause": self.root_cause.to_json() if self.root_cause else None,
            **self.health.to_json(),
            "in_job_restarts": dataclasses.asdict(self.in_job_restarts),
            "spares": self.spares.to_json(),
        }


def summaries(runs: Sequence[RunDir]) -> list[Summary]:
    """summary() of every run, their states asked in one batched question (dispatch.states: Slurm
    is asked once for all the runs, not once per run). Each folder is checked and each file read
    once (`runs` lists 10,000 runs)."""
    safe = [run for run in runs if _safe(run)]
    known = dispatch.states(safe)
    checked = set(safe)
    return [summary(run, known.get(run), checked=run in checked) for run in runs]


def _safe(run: RunDir) -> bool:
    """Nothing is read from a folder another account could have written (summary says why)."""
    try:
        run.check_safe()
    except (UnsafeRun, OSError):
        return False
    return True


def summary(run: RunDir, state: str | None = None, *, checked: bool = False) -> Summary:
    """One run's row (`state`: the scheduler's, when already asked; `checked`: check_safe passed
    just now); a run whose files cannot be read, or that another account could have written (a
    swapped folder: nothing in it is read), is a BROKEN row saying why (one broken folder never
    hides the others)."""
    try:
        return _read_summary(run, state, checked)
    except (BrokenRun, UnsafeRun, OSError, ValueError, TypeError, AttributeError, KeyError) as e:
        why = (
            e.format_message()
            if isinstance(e, BrokenRun | UnsafeRun)
            else f"{type(e).__name__}: {e}"
        )
        return Summary(
            name=run.name,
            state=BROKEN,
            job_id=None,
            scheduler=None,
            profile=None,
            nodes=None,
            gpus_per_node=None,
            strategy=None,
            mesh=None,
            restarts=0,
            starts=0,
            checkpoint_step=None,
            created=None,
            path=str(run.path),
            reason=why,
        )


def _read_summary(run: RunDir, asked: str | None, checked: bool) -> Summary:
    if not checked:
        run.check_safe()
    rec = run.record()
    starts, jobs, events = run.restarts(), run.jobs(), run.events()
    state = asked or dispatch.state(run)
    now = phase.Phase(state)
    if state in states.LIVE:  # what the run folder knows sooner than the scheduler
        snap = snapshot(run)
        seen = time.time() - snap.age_s if snap is not None and snap.age_s is not None else None
        marker = (run.path / layout.PREEMPTED).exists()
        now = phase.phase(state, starts, events, marker=marker, last_metric_time=seen)
    mesh = (run.json_object(layout.MESH) or {}).get("mesh")  # layout.read_mesh, in one open
    return Summary(
        name=run.name,
        state=now.state,
        scheduler_state=state,
        phase=now.note,
        job_id=run.last_job_id(),
        scheduler=rec.scheduler,
        profile=rec.profile_name,
        nodes=rec.nodes,
        gpus_per_node=rec.gpus,
        strategy=rec.strategy if rec.entry_kind == "train_entry" else rec.entry_kind,
        mesh=mesh if isinstance(mesh, str) else None,
        restarts=phase.restarts(starts, jobs, events),
        starts=len(starts),
        checkpoint_step=run.newest_checkpoint_step(),
        created=rec.created,
        path=str(run.path),
        reason=run.failure_reason() if state in states.FAILURES else None,
    )


def detail(r: RunDir) -> Detail:
    """summary() plus the start history, submissions, chain segments, training progress, the root
    cause of a failure and node health (preflight verdicts, stalls)."""
    row = summary(r)
    if row.state == BROKEN:
        raise UserError(row.reason or BROKEN)
    rec = r.record()
    history = r.restarts()
    segments: list[dict[str, str]] = []
    if rec.scheduler == "slurm":
        from hpctrain.dispatch.slurm import chain_states  # lazy: CLI start-up: Slurm runs only

        segments = chain_states(r)
    cause = root_cause(r.path) if row.scheduler_state not in _NOT_FAILED else None
    if cause is not None and not row.reason:
        # the first line of `status`: which rank failed first, and how
        row = dataclasses.replace(row, reason=cause.line)
    events = r.events()
    return Detail(
        **vars(row),
        history=history,
        jobs=[dict(job.line) for job in r.jobs()],
        chain=segments,
        progress=snapshot(r),
        root_cause=cause,
        health=health(events),
        in_job_restarts=in_job.summary(events),
        spares=spares.summary(
            events,
            asked=rec.spare_nodes if rec.scheduler == "slurm" else 0,
            newest_start=history[-1] if history else None,
            verdict=_json(r.path / layout.PREFLIGHT_LATEST),
        ),
    )


def _json(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class RunCancelled:
    name: str
    before: str
    after: str | None  # None: it was not running


@dataclass(frozen=True)
class SweepCancelled:
    sweep: str
    points: list[tuple[str, str]]  # (point, its state after the cancel)


def cancel(ref: str, runs_dir: Path | None = None) -> RunCancelled | SweepCancelled:
    """Cancel a run's current job (or every point of a sweep)."""
    found = sweepdir.find(ref, runs_dir)
    if found is not None:
        return SweepCancelled(found.name, points.cancel(found))
    r = find_run(ref, runs_dir)
    before = dispatch.state(r)
    if before in TERMINAL:
        return RunCancelled(r.name, before, None)
    return RunCancelled(r.name, before, dispatch.cancel(r))
