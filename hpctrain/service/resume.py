"""resume and preempt: bring a stopped run back into its own folder; rehearse a preemption.

No torch here. Warnings go to the caller's `warn`; failures are UserError (exit 2).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain import dispatch
from hpctrain.jobs.request import JobRequest
from hpctrain.jobs.spec import JobSpec
from hpctrain.kernel import layout, states
from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.checkpoint import newest_verified
from hpctrain.kernel.errors import UserError, ValidationError
from hpctrain.profiles import schema
from hpctrain.render.script import render
from hpctrain.runs import progress, sweepdir
from hpctrain.runs.folder import RunDir, copy_aside
from hpctrain.service import points, sweep
from hpctrain.service.submit import resubmit

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile

ACTIVE = states.LIVE
Warn = Callable[[str], None]
Changes = dict[str, int | list[str]]  # what a resume changes: max_steps, args, time_min, nodes


@dataclass(frozen=True)
class Checkpoint:
    """The newest checkpoint that verifies, as its manifest says."""

    name: str  # its folder, step-<N>
    step: int | None
    strategy: str | None  # the strategy that saved it


def newest_checkpoint(run: RunDir, warn: Warn | None = None) -> Checkpoint | None:
    """The newest checkpoint whose manifest checks (names, sizes; read without torch). Its
    digests are left to the job's ranks, each hashing the files it reads (issue 37: the whole
    read of a 1 TB checkpoint on the login node took minutes); a damaged one is skipped there."""
    found = newest_verified(run.path / layout.CHECKPOINTS, warn=warn, digests=False)
    if found is None:
        return None
    step, strategy = found[1].get("step"), found[1].get("strategy")
    return Checkpoint(
        name=found[0].name,
        step=step if isinstance(step, int) else None,
        strategy=str(strategy) if strategy else None,
    )


def _max_steps(args: tuple[str, ...] | list[str]) -> int | None:
    """The last --max-steps / --train.max_steps in the entry's arguments, if any."""
    value = None
    args = list(args)
    for i, a in enumerate(args):
        for flag in ("--max-steps", "--train.max_steps"):
            if a == flag and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(flag + "="):
                value = a.split("=", 1)[1]
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Planned:
    """A resume checked and ready (nothing written yet): what `resume --dry-run` shows."""

    run: RunDir
    previous_state: str
    checkpoint: Checkpoint | None
    changes: Changes
    profile: ResolvedProfile
    request: JobRequest  # the new JobRequest


def plan(
    r: RunDir,
    *,
    time_min: int | None = None,
    max_steps: int | None = None,
    nodes: int | None = None,
    args: tuple[str, ...] = (),
    warn: Warn = lambda _: None,
) -> Planned:
    """Check that run `r` (hpctrain.runs.folder.RunDir) can resume with these changes; writes nothing.
    A run folder another account could have written (swapped into a shared runs_dir) is refused
    before anything in it is read: its profile would become the job's script."""
    r.check_safe()
    # a broken run.yaml (any line: record() reads only the ones `runs` shows) says so before
    # the scheduler is asked
    r.record().document  # noqa: B018 - the whole file's parse, for its error
    current = dispatch.state(r)
    if current in ACTIVE:
        raise UserError(
            f"{r.name} is {current} (job {r.last_job_id()}): it is still running and resumes "
            f"by itself after a preemption; to restart it, `hpctrain cancel {r.name}` first"
        )
    req = _frozen_request(r)
    ckpt = newest_checkpoint(r, warn)
    _check_steps(r, current, ckpt, old=_max_steps(req.args), new=max_steps)
    profile = _frozen_profile(r)
    changes: Changes = {}
    new_args = list(req.args)
    if max_steps is not None:
        new_args += ["--max-steps", str(max_steps)]
        changes["max_steps"] = max_steps
    if args:
        new_args += list(args)
        changes["args"] = list(args)
    if time_min is not None and time_min != req.time_min:
        changes["time_min"] = time_min
    if nodes is not None and nodes != req.nodes:
        _check_nodes(r, req, ckpt, nodes=nodes, args=args, warn=warn)
        changes["nodes"] = nodes
    new = resumed(
        req,
        nodes=nodes if nodes is not None and "nodes" in changes else req.nodes,
        time_min=time_min if time_min is not None and "time_min" in changes else req.time_min,
        args=tuple(new_args),
    )
    problems = new.problems(profile)
    if problems:
        raise ValidationError(problems)
    return Planned(
        run=r,
        previous_state=current,
        checkpoint=ckpt,
        changes=changes,
        profile=profile,
        request=new,
    )


def resumed(req: JobRequest, *, nodes: int, time_min: int, args: tuple[str, ...]) -> JobRequest:
    """The run's own request with what resume changes; --min-nodes and --exclude kept (a node
    range ends at the new count)."""
    low = req.min_nodes if req.min_nodes is not None and req.min_nodes < nodes else None
    return dataclasses.replace(req, nodes=nodes, time_min=time_min, args=args, min_nodes=low)


def _check_steps(
    r: RunDir, current: str, ckpt: Checkpoint | None, *, old: int | None, new: int | None
) -> None:
    """A COMPLETED run resumes only to train further; --max-steps only adds steps."""
    done = ckpt.step if ckpt else None
    if current == states.COMPLETED and (new is None or (old is not None and new <= old)):
        raise UserError(
            f"{r.name} is COMPLETED ({_where(r, ckpt)}); "
            f"nothing to resume. To train further pass --max-steps N with N > "
            f"{old if old is not None else 'the steps done'}; to start over use "
            "`hpctrain submit --replace-finished`"
        )
    if new is not None:
        floor = max(x for x in (old, done, 0) if x is not None)
        if new < floor:
            raise UserError(
                f"--max-steps {new} is fewer than the {floor} steps the run was set to "
                "(or has done); resume can only add steps"
            )


def _where(r: RunDir, ckpt: Checkpoint | None) -> str:
    """Where a finished run ended: its last step from metrics (what it trained), and its newest
    checkpoint when that is older (a script that saves only on a stop: issue 34)."""
    prog = progress.snapshot(r)
    step = ckpt.step if ckpt and ckpt.step is not None else None
    saved = f"newest checkpoint step {step}" if step is not None else "no checkpoint"
    if prog is None:
        return f"step {step}" if step is not None else saved
    reached = f"step {prog.step}" + (f"/{prog.total}" if prog.total else "")
    return reached if step == prog.step else f"{reached}; {saved}"


def _check_nodes(
    r: RunDir,
    req: JobRequest,
    ckpt: Checkpoint | None,
    *,
    nodes: int,
    args: tuple[str, ...],
    warn: Warn,
) -> None:
    """Another node count: only for a strategy whose checkpoints reshard, at a batch that splits."""
    strategy = (ckpt.strategy or req.strategy) if ckpt else req.strategy
    if not strategy_names.info(strategy).reshards:
        raise UserError(
            f"--nodes {nodes}: {r.name} uses {strategy}, whose checkpoints load only at the world "
            f"size they were saved with ({req.nodes} node(s) x {req.gpus}); resume with --nodes "
            f"{req.nodes}, or see docs/checkpoint-resume.md (DeepSpeed universal checkpoints)"
        )
    if req.entry.kind != "train_entry":
        warn(f"--nodes {nodes}: your own entry must reshard its checkpoint itself")
    elif ckpt and not any(a.startswith(("--train.", "--config")) for a in args):
        config = r.path / layout.CHECKPOINTS / ckpt.name / "config.json"
        _check_batch(config, nodes * req.gpus, nodes)


_REDO = (
    "fix: submit it again as a new run (`hpctrain submit`), or resume it with the hpctrain "
    "version that made it (run.yaml's `version`); its checkpoints are untouched"
)


def _frozen_request(r: RunDir) -> JobRequest:
    """run.yaml's request as this hpctrain reads it, else one line naming the key."""
    d = dict(r.record().request)
    known = {f.name for f in dataclasses.fields(JobRequest)}
    unknown = sorted(str(k) for k in d if k not in known)
    if unknown:
        raise UserError(f"{r.run_yaml}: request.{unknown[0]} is not a request key here; {_REDO}")
    try:
        return JobRequest.from_dict(d)
    except (TypeError, ValueError, AttributeError) as e:
        raise UserError(f"{r.run_yaml}: its request cannot be read ({e}); {_REDO}") from None


def _frozen_profile(r: RunDir) -> ResolvedProfile:
    """run.yaml's frozen profile, validated by this hpctrain, else one line naming the key."""
    try:
        return schema.Profile.model_validate(r.record().profile)
    except schema.ValidationError as e:
        errors = e.errors()
        where = ".".join(str(x) for x in errors[0]["loc"]) if errors else "?"
        msg = errors[0]["msg"] if errors else "invalid"
        raise UserError(
            f"{r.run_yaml}: profile.{where}: {msg} (the frozen profile no "
            f"longer validates with this hpctrain); {_REDO}"
        ) from None


def apply(p: Planned) -> None:
    """Re-freeze the request and re-render job.sh when the resume changes them (the old script is
    kept beside it); nothing when it changes nothing."""
    if not p.changes:
        return

    r = p.run
    python = r.record().node_python
    frozen = r.frozen()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    copy_aside(r.job_sh, f"job.sh.before-resume-{stamp}")  # never over an earlier one
    r.write_script(render(JobSpec.build(p.profile, p.request, r.path, python=python)))
    before = frozen.get("resumes")
    frozen["request"] = p.request.to_dict()
    frozen["resumes"] = [
        *(before if isinstance(before, list) else []),
        {"time": stamp, "changes": p.changes},
    ]
    r.freeze(frozen)


@dataclass(frozen=True)
class Resumed:
    """A resubmission: the `resume` event, as events.jsonl records it."""

    time: str
    job_id: str
    previous_state: str
    from_checkpoint: str | None
    changes: Changes

    def to_json(self) -> dict[str, object]:
        return {
            "time": self.time,
            "event": "resume",
            "job_id": self.job_id,
            "previous_state": self.previous_state,
            "from_checkpoint": self.from_checkpoint,
            "changes": self.changes,
        }


def _record(p: Planned, job_id: str) -> Resumed:
    origin = p.checkpoint.name if p.checkpoint else None
    written = p.run.event(
        "resume",
        job_id=job_id,
        previous_state=p.previous_state,
        from_checkpoint=origin,
        changes=p.changes,
    )
    return Resumed(
        time=str(written["time"]),
        job_id=job_id,
        previous_state=p.previous_state,
        from_checkpoint=origin,
        changes=p.changes,
    )


def resume(
    r: RunDir,
    *,
    time_min: int | None = None,
    max_steps: int | None = None,
    nodes: int | None = None,
    args: tuple[str, ...] = (),
    warn: Warn = lambda _: None,
) -> Resumed:
    """Resubmit run `r` (hpctrain.runs.folder.RunDir) from its newest verified checkpoint."""
    p = plan(r, time_min=time_min, max_steps=max_steps, nodes=nodes, args=args, warn=warn)
    apply(p)
    return _record(p, resubmit(r, p.profile, time_min=p.request.time_min))


@dataclass(frozen=True)
class PointResumed:
    index: int
    point: str
    previous_state: str
    from_checkpoint: str | None


@dataclass(frozen=True)
class SweepResumed:
    """What `resume SWEEP` did (or, dry run, would do)."""

    sweep: str
    points: list[PointResumed]
    array_line: str | None = None  # `#SBATCH --array=...` (None: no point left)
    array_job: str | None = None  # None when dry_run or no point is left
    script: str | None = None  # the array script


def resume_sweep(
    sweep_dir: Path,
    *,
    time_min: int | None = None,
    max_steps: int | None = None,
    nodes: int | None = None,
    args: tuple[str, ...] = (),
    dry_run: bool = False,
    warn: Warn = lambda _: None,
) -> SweepResumed:
    """A Slurm sweep's unfinished points (hpctrain.service.sweep.RESUMABLE) as ONE job array of only their
    indexes (`--array=i,j,k[%K]`, the sweep's --max-parallel): array task i runs point i's own
    job.sh, which resumes its run folder from its newest verified checkpoint. Finished and active
    points are not touched. Every point is checked before anything is written."""
    data = sweepdir.read(sweep_dir)
    rows = [row for row in points.table(sweep_dir) if row.state in sweep.RESUMABLE]
    plans = [
        plan(
            RunDir(row.path),
            time_min=time_min,
            max_steps=max_steps,
            nodes=nodes,
            args=args,
            warn=warn,
        )
        for row in rows
    ]
    out = SweepResumed(
        sweep=sweep_dir.name,
        points=[
            PointResumed(
                index=row.index,
                point=row.point,
                previous_state=p.previous_state,
                from_checkpoint=p.checkpoint.name if p.checkpoint else None,
            )
            for row, p in zip(rows, plans, strict=True)
        ],
    )
    if not plans:
        return out
    spec = sweep.resume_spec([int(row.index) for row in rows], data.get("max_parallel"))
    first = plans[0]
    script = sweep.array_script(
        str(data.get("name") or sweep_dir.name),
        sweep_dir,
        list(JobSpec.build(first.profile, first.request, first.run.path).directives),
        [sweep_dir / str(pt["folder"]) for pt in data.get("points", [])],
        spec,
    )
    out = dataclasses.replace(out, array_line=f"#SBATCH --array={spec}", script=script)
    if dry_run:
        return out
    for p in plans:
        apply(p)
    if (sweep_dir / sweepdir.ARRAY_FILE).is_file():
        copy_aside(sweep_dir / sweepdir.ARRAY_FILE, f"{sweepdir.ARRAY_FILE}.before-resume")
    sweepdir.write_array(sweep_dir, script)
    array_id = sweep.sbatch_array(sweep_dir, script)
    for row, p in zip(rows, plans, strict=True):
        job_id = f"{array_id}_{row.index}"
        p.run.add_job(job_id, kind="resume", scheduler="slurm")
        _record(p, job_id)
    resumes = [*data.get("resumes", []), {"array_job": array_id, "array": spec}]
    sweepdir.write(sweep_dir, {**data, "array_job": array_id, "resumes": resumes})
    return dataclasses.replace(out, array_job=array_id)


def _check_batch(config_json: Path, world: int, nodes: int) -> None:
    """The frozen TrainConfig's batch arithmetic at the new world size (train_entry would refuse it
    at start, after the job waited in the queue)."""
    try:
        t = json.loads(config_json.read_text())["train"]
        global_batch, micro, accum = (
            int(t["global_batch"]),
            int(t["micro_batch"]),
            t.get("grad_accum"),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return
    per_step = world * micro
    if accum is None and global_batch % per_step == 0:
        return
    if accum is not None and per_step * int(accum) == global_batch:
        return
    raise UserError(
        f"--nodes {nodes}: train.global_batch({global_batch}) does not split over "
        f"{world} ranks x train.micro_batch({micro})"
        + (f" x train.grad_accum({accum})" if accum is not None else "")
        + "; choose a node count that divides it, or pass e.g. "
        "-- --train.micro_batch=N (the global batch stays the same)"
    )
