"""Submit: the one path from a prepared run to a queued job (submit, resume, doctor, sweeps' points).

`submit()` is what `hpctrain submit` does; `start()` creates the run folder and queues it (also
used by doctor's short jobs); `resubmit()` queues an existing folder again (resume). Every one
records the submission in jobs.jsonl through hpctrain.dispatch.submit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain import dispatch
from hpctrain.jobs.options import JobOptions
from hpctrain.kernel import layout
from hpctrain.kernel.values import mutable
from hpctrain.runs import chain
from hpctrain.service import nodetorch
from hpctrain.service.prepare import Prepared, entry_line, snapshot_plan
from hpctrain.service.upload import adopt, check_upload, install

if TYPE_CHECKING:
    from hpctrain.jobs.request import JobRequest
    from hpctrain.plan.ladder import Recommendation
    from hpctrain.profiles.resolved import ResolvedProfile
    from hpctrain.runs.folder import RunDir


@mutable
class Submitted:
    """What a submission did (or, dry_run, would do)."""

    name: str
    job_id: str | None
    where: str
    topology: str
    entry: str
    run_path: Path
    profile: str
    time_min: int
    scheduler: str = ""  # slurm | local
    dry_run: bool = False
    script_lines: int = 0
    moved_aside: Path | None = None
    chain: list[str] = field(default_factory=list)  # one line per segment (empty: one job)
    chain_time_min: int = 0
    max_time_min: int | None = None
    total_steps: int | None = None
    recovery: str = ""  # what a failure during training leads to
    snapshots: str = ""  # dry run: the in-memory snapshots' memory (hpctrain/plan/snapshots.py)

    def to_json(self) -> dict[str, object]:
        """`submit --json` (documented in its --help): what a script needs to follow the run."""
        return {
            "name": self.name,
            "run_dir": str(self.run_path),
            "job_id": self.job_id,
            "job_ids": self.job_id.split(" -> ") if self.job_id else [],
            "profile": self.profile,
            "scheduler": self.scheduler,
            "where": self.where,
            "topology": self.topology,
            "entry": self.entry,
            "time_min": self.time_min,
            "total_steps": self.total_steps,
            "chain": self.chain,
            "moved_aside": str(self.moved_aside) if self.moved_aside else None,
            "dry_run": self.dry_run,
        }


def recovery(profile: ResolvedProfile) -> str:
    """One line: how a failure during training is recovered (the preemption section)."""
    pre = profile.preemption
    inside = (
        f"restarted in the job up to {pre.max_in_job_restarts} time(s)"
        if pre.max_in_job_restarts
        else "no in-job restart"
    )
    requeue = f"requeued up to {pre.max_restarts} time(s)" if pre.requeue else "never requeued"
    spares = (
        f"a node the preflight gate confirms bad: swapped for one of {pre.spare_nodes} hot "
        "spare(s) in the job (preemption.spare_nodes); "
        if pre.spare_nodes and profile.scheduler == "slurm"
        else ""
    )
    return (
        f"{spares}a dead, stalled or timed-out worker: {inside} (preemption.max_in_job_restarts); "
        f"a preemption or stall: {requeue}; an error that repeats fails at once"
    )


def submit(o: JobOptions, profile: ResolvedProfile) -> tuple[Submitted, RunDir]:
    """Validate, render and (unless o.dry_run) create the run folder and queue the job(s).
    Returns the record and the run folder."""
    dry_run, replace_finished = o.dry_run, o.replace_finished
    code = Path(o.code) if o.code else None
    if code is not None:  # before anything is written: --code is moved, never any folder
        check_upload(code, o.script)
    segments: list[chain.Segment] = []
    if o.chain:
        segments = chain.plan(o.time_min or profile.slurm.default_time_min, profile)
        o = dataclasses.replace(o, time_min=segments[0].time_min)
    p = Prepared(o, profile, chain=len(segments) > 1)
    nodetorch.check(p.profile, p.python)  # a torch outside the supported range: refused here
    if code is not None:
        adopt(p, code)
    run, profile, req = p.run, p.profile, p.request
    previous = dispatch.state(run) if run.exists() else None
    run.check_free(previous, replace_finished=replace_finished)
    run.check_writable()
    slurm = profile.scheduler == "slurm"
    rec = Submitted(
        name=req.name,
        job_id=None,
        where="Slurm (sbatch)" if slurm else "this machine (local executor)",
        topology=f"{req.nodes} node(s) x {req.gpus} {'GPU' if slurm else 'worker'}(s)"
        + (f" + {req.spares(profile)} hot spare node(s)" if req.spares(profile) else ""),
        entry=entry_line(p),
        run_path=run.path,
        profile=profile.name,
        time_min=req.time_min,
        scheduler=profile.scheduler,
        dry_run=dry_run,
        script_lines=len(p.script.splitlines()),
        max_time_min=profile.slurm.max_time_min,
        total_steps=p.resolved["max_steps"] if p.resolved else None,
        recovery=recovery(profile),
    )
    if len(segments) > 1:
        rec.chain = chain.describe(segments)
        rec.chain_time_min = sum(x.time_min for x in segments)
    if dry_run:
        planned = snapshot_plan(p)
        rec.snapshots = planned.line(interval=True) if planned is not None else ""
        return rec, run
    rec.job_id = start(
        run,
        profile,
        req,
        p.script,
        node_python=p.python,
        replace_finished=replace_finished,
        plan=p.plan,
        segments=segments,
        code=code,
    )
    rec.moved_aside = run.moved_aside
    return rec, run


def start(
    run: RunDir,
    profile: ResolvedProfile,
    request: JobRequest,
    script: str,
    *,
    node_python: str | None = None,
    replace_finished: bool = False,
    plan: Recommendation | None = None,
    segments: list[chain.Segment] | None = None,
    code: Path | None = None,
) -> str:
    """Create the run folder (run.yaml, job.sh) and queue it; the job id (a chain: `a -> b -> c`)."""
    run.create(
        profile=profile,
        request=request,
        script=script,
        replace_finished=replace_finished,
        node_python=node_python,
    )
    if code is not None:
        install(run.path, code)
    if plan is not None:
        run.write(layout.PLAN, plan.to_json() + "\n")
    if segments and len(segments) > 1:
        from hpctrain.dispatch.slurm import submit_chain  # lazy: CLI start-up: Slurm chains only

        return " -> ".join(submit_chain(run, segments))
    return dispatch.submit(run, profile, time_min=request.time_min)


def resubmit(run: RunDir, profile: ResolvedProfile, *, time_min: int) -> str:
    """Queue an existing run folder's job.sh again (resume)."""
    return dispatch.submit(run, profile, time_min=time_min, kind="resume")


def wait(
    run: RunDir,
    *,
    poll_s: float | None = None,
    on_change: Callable[[str], None] | None = None,
    on_poll: Callable[[str], None] | None = None,
) -> str:
    """Block until the run's job ends (hpctrain.dispatch.wait); the final state."""
    return dispatch.wait(run, poll_s=poll_s, on_change=on_change, on_poll=on_poll)
