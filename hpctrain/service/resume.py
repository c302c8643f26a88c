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
from typing import TYPE_CHECKING, Any

from hpctrain import dispatch
from hpctrain.jobs import sweep
from hpctrain.jobs.request import JobRequest
from hpctrain.kernel import layout
from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.checkpoint import newest_verified
from hpctrain.kernel.errors import UserError, ValidationError
from hpctrain.profiles import schema
from hpctrain.render.script import render, sbatch_directives
from hpctrain.runs import points, sweepdir
from hpctrain.runs.folder import RunDir, copy_aside
from hpctrain.service.submit import resubmit

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile

ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}
Warn = Callable[[str], None]


def newest_checkpoint(run: RunDir, warn: Warn | None = None) -> tuple[str, dict[str, Any]] | None:
    """(folder name, manifest) of the newest checkpoint that verifies, read without torch."""
    found = newest_verified(run.path / layout.CHECKPOINTS, warn=warn)
    return (found[0].name, found[1]) if found else None


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


@dataclass
class Planned:
    """A resume checked and ready (nothing written yet): what `resume --dry-run` shows."""

    run: RunDir
    previous_state: str
    checkpoint: tuple[str, dict[str, Any]] | None
    changes: dict[str, Any]
    profile: ResolvedProfile
    request: JobRequest  # the new JobRequest
    frozen: dict[str, Any]


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
    frozen = r.frozen()
    current = dispatch.state(r)
    if current in ACTIVE:
        raise UserError(
            f"{r.name} is {current} (job {r.last_job_id()}): it is still running and resumes "
            f"by itself after a preemption; to restart it, `hpctrain cancel {r.name}` first"
        )
    req = _frozen_request(r, frozen)
    old_steps = _max_steps(req.args)
    ckpt = newest_checkpoint(r, warn)
    done_step = ckpt[1]["step"] if ckpt else None
    if current == "COMPLETED" and (
        max_steps is None or (old_steps is not None and max_steps <= old_steps)
    ):
        raise UserError(
            f"{r.name} is COMPLETED ({'step ' + str(done_step) if ckpt else 'no checkpoint'}); "
            f"nothing to resume. To train further pass --max-steps N with N > "
            f"{old_steps if old_steps is not None else 'the steps done'}; to start over use "
            "`hpctrain submit --replace-finished`"
        )
    if max_steps is not None:
        floor = max(x for x in (old_steps, done_step, 0) if x is not None)
        if max_steps < floor:
            raise UserError(
                f"--max-steps {max_steps} is fewer than the {floor} steps the run was set to "
                "(or has done); resume can only add steps"
            )
    profile = _frozen_profile(r, frozen)
    changes: dict[str, Any] = {}
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
        strategy = str(ckpt[1].get("strategy") or req.strategy) if ckpt else req.strategy
        if not strategy_names.info(strategy).reshards:
            raise UserError(
                f"--nodes {nodes}: {r.name} uses {strategy}, whose checkpoints load only at the world "
                f"size they were saved with ({req.nodes} node(s) x {req.gpus}); resume with --nodes "
                f"{req.nodes}, or see docs/checkpoint-resume.md (DeepSpeed universal checkpoints)"
            )
        if req.entry.kind != "train_entry":
            warn(f"--nodes {nodes}: your own entry must reshard its checkpoint itself")
        elif ckpt and not any(a.startswith(("--train.", "--config")) for a in args):
            _check_batch(
                r.path / layout.CHECKPOINTS / ckpt[0] / "config.json", nodes * req.gpus, nodes
            )
        changes["nodes"] = nodes
    new = JobRequest(
        name=req.name,
        nodes=changes.get("nodes", req.nodes),
        gpus=req.gpus,
        time_min=changes.get("time_min", req.time_min),
        strategy=req.strategy,
        entry=req.entry,
        args=tuple(new_args),
    )
    problems = new.problems(profile)
    if problems:
        raise ValidationError(problems)
    return Planned(r, current, ckpt, changes, profile, new, frozen)


_REDO = (
    "fix: submit it again as a new run (`hpctrain submit`), or resume it with the hpctrain "
    "version that made it (run.yaml's `version`); its checkpoints are untouched"
)


def _frozen_request(r: RunDir, frozen: dict[str, Any]) -> JobRequest:
    """run.yaml's request as this hpctrain reads it, else one line naming the key."""
    d = frozen["request"]
    known = {f.name for f in dataclasses.fields(JobRequest)}
    unknown = sorted(str(k) for k in d if k not in known)
    if unknown:
        raise UserError(f"{r.run_yaml}: request.{unknown[0]} is not a request key here; {_REDO}")
    try:
        return JobRequest.from_dict(d)
    except (TypeError, ValueError, AttributeError) as e:
        raise UserError(f"{r.run_yaml}: its request cannot be read ({e}); {_REDO}") from None


def _frozen_profile(r: RunDir, frozen: dict[str, Any]) -> ResolvedProfile:
    """run.yaml's frozen profile, validated by this hpctrain, else one line naming the key."""
    try:
        return schema.Profile.model_validate(frozen["profile"])
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

    r, frozen = p.run, p.frozen
    stamp = time.strftime("%Y%m%d-%H%M%S")
    copy_aside(r.job_sh, f"job.sh.before-resume-{stamp}")  # never over an earlier one
    r.write_script(render(p.profile, p.request, r.path, python=frozen.get("node_python")))
    frozen["request"] = p.request.to_dict()
    frozen.setdefault("resumes", []).append({"time": stamp, "changes": p.changes})
    r.freeze(frozen)


def _record(p: Planned, job_id: str) -> dict[str, Any]:
    return dict(
        p.run.event(
            "resume",
            job_id=job_id,
            previous_state=p.previous_state,
            from_checkpoint=p.checkpoint[0] if p.checkpoint else None,
            changes=p.changes,
        )
    )


def resume(
    r: RunDir,
    *,
    time_min: int | None = None,
    max_steps: int | None = None,
    nodes: int | None = None,
    args: tuple[str, ...] = (),
    warn: Warn = lambda _: None,
) -> dict[str, Any]:
    """Resubmit run `r` (hpctrain.runs.folder.RunDir) from its newest verified checkpoint; the `resume`
    event as recorded in events.jsonl (time, event, job_id, previous_state, from_checkpoint, changes)."""
    p = plan(r, time_min=time_min, max_steps=max_steps, nodes=nodes, args=args, warn=warn)
    apply(p)
    return _record(p, resubmit(r, p.profile, time_min=p.request.time_min))


def resume_sweep(
    sweep_dir: Path,
    *,
    time_min: int | None = None,
    max_steps: int | None = None,
    nodes: int | None = None,
    args: tuple[str, ...] = (),
    dry_run: bool = False,
    warn: Warn = lambda _: None,
) -> dict[str, Any]:
    """A Slurm sweep's unfinished points (hpctrain.jobs.sweep.RESUMABLE) as ONE job array of only their
    indexes (`--array=i,j,k[%K]`, the sweep's --max-parallel): array task i runs point i's own
    job.sh, which resumes its run folder from its newest verified checkpoint. Finished and active
    points are not touched. Every point is checked before anything is written.
    {"sweep", "points": [{"index", "point", "previous_state", "from_checkpoint"}], "array_line",
    "array_job" (None when dry_run or nothing is left), "script"}."""
    data = sweepdir.read(sweep_dir)
    rows = [row for row in points.table(sweep_dir) if row["state"] in sweep.RESUMABLE]
    plans = [
        plan(
            RunDir(row["path"]),
            time_min=time_min,
            max_steps=max_steps,
            nodes=nodes,
            args=args,
            warn=warn,
        )
        for row in rows
    ]
    out: dict[str, Any] = {
        "sweep": sweep_dir.name,
        "points": [
            {
                "index": row["index"],
                "point": row["point"],
                "previous_state": p.previous_state,
                "from_checkpoint": p.checkpoint[0] if p.checkpoint else None,
            }
            for row, p in zip(rows, plans, strict=True)
        ],
        "array_line": None,
        "array_job": None,
        "script": None,
    }
    if not plans:
        return out
    spec = sweep.resume_spec([int(row["index"]) for row in rows], data.get("max_parallel"))
    first = plans[0]
    script = sweep.array_script(
        str(data.get("name") or sweep_dir.name),
        sweep_dir,
        sbatch_directives(first.profile, first.request, str(first.run.path)),
        [sweep_dir / str(pt["folder"]) for pt in data.get("points", [])],
        spec,
    )
    out |= {"array_line": f"#SBATCH --array={spec}", "script": script}
    if dry_run:
        return out
    for p in plans:
        apply(p)
    if (sweep_dir / sweepdir.ARRAY_FILE).is_file():
        copy_aside(sweep_dir / sweepdir.ARRAY_FILE, f"{sweepdir.ARRAY_FILE}.before-resume")
    sweepdir.write_array(sweep_dir, script)
    array_id = sweep.sbatch_array(sweep_dir, script)
    for row, p in zip(rows, plans, strict=True):
        job_id = f"{array_id}_{row['index']}"
        p.run.add_job(job_id, kind="resume", scheduler="slurm")
        _record(p, job_id)
    resumes = [*data.get("resumes", []), {"array_job": array_id, "array": spec}]
    sweepdir.write(sweep_dir, {**data, "array_job": array_id, "resumes": resumes})
    out["array_job"] = array_id
    return out


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
