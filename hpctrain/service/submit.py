"""Submit: the one path from a prepared run to a queued job (submit, resume, doctor, sweeps' points).

`submit()` is what `hpctrain submit` does; `start()` creates the run folder and queues it (also
used by doctor's short jobs); `resubmit()` queues an existing folder again (resume). Every one
records the submission in jobs.jsonl through hpctrain.dispatch.submit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.kernel import layout


@dataclass
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
    dry_run: bool = False
    script_lines: int = 0
    moved_aside: Path | None = None
    chain: list[str] = field(default_factory=list)  # one line per segment (empty: one job)
    chain_time_min: int = 0
    max_time_min: int | None = None
    total_steps: int | None = None


def submit(
    o: dict[str, Any],
    profile: Any,
    *,
    dry_run: bool = False,
    replace_finished: bool = False,
    code: Path | None = None,
) -> tuple[Submitted, Any]:
    """Validate, render and (unless dry_run) create the run folder and queue the job(s).
    Returns the record and the run folder (hpctrain.runs.RunDir)."""
    from hpctrain import dispatch
    from hpctrain.service.prepare import Prepared, entry_line

    segments: list[Any] = []
    if o.get("chain"):
        from hpctrain import chain

        segments = chain.plan(o["time_min"] or profile.slurm.default_time_min, profile)
        o = {**o, "time_min": segments[0].time_min}
    p = Prepared(o, profile, chain=len(segments) > 1)
    if code is not None:
        from hpctrain.remote.code import adopt

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
        topology=f"{req.nodes} node(s) x {req.gpus} {'GPU' if slurm else 'worker'}(s)",
        entry=entry_line(p),
        run_path=run.path,
        profile=profile.name,
        time_min=req.time_min,
        dry_run=dry_run,
        script_lines=len(p.script.splitlines()),
        max_time_min=profile.slurm.max_time_min,
        total_steps=p.resolved["max_steps"] if p.resolved else None,
    )
    if len(segments) > 1:
        from hpctrain import chain

        rec.chain = chain.describe(segments)
        rec.chain_time_min = sum(x.time_min for x in segments)
    if dry_run:
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
    run: Any,
    profile: Any,
    request: Any,
    script: str,
    *,
    node_python: str | None = None,
    replace_finished: bool = False,
    plan: Any = None,
    segments: list[Any] | None = None,
    code: Path | None = None,
) -> str:
    """Create the run folder (run.yaml, job.sh) and queue it; the job id (a chain: `a -> b -> c`)."""
    from hpctrain import dispatch

    run.create(
        profile=profile,
        request=request,
        script=script,
        replace_finished=replace_finished,
        node_python=node_python,
    )
    if code is not None:
        from hpctrain.remote.code import install

        install(run.path, code)
    if plan is not None:
        run.write(layout.PLAN, plan.to_json() + "\n")
    if segments and len(segments) > 1:
        from hpctrain.dispatch.slurm import submit_chain

        return " -> ".join(submit_chain(run, segments))
    return dispatch.submit(run, profile, time_min=request.time_min)


def resubmit(run: Any, profile: Any, *, time_min: int) -> str:
    """Queue an existing run folder's job.sh again (resume)."""
    from hpctrain import dispatch

    return dispatch.submit(run, profile, time_min=time_min, kind="resume")


def wait(run: Any, **kwargs: Any) -> str:
    """Block until the run's job ends (hpctrain.dispatch.wait); the final state."""
    from hpctrain import dispatch

    return dispatch.wait(run, **kwargs)
