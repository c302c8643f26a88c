"""resume and preempt: bring a stopped run back into its own folder; rehearse a preemption.

No torch here. Warnings go to the caller's `warn`; failures are UserError (exit 2).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpctrain.kernel import layout
from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.checkpoint import newest_verified
from hpctrain.kernel.errors import UserError
from hpctrain.service.submit import resubmit

ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}
Warn = Callable[[str], None]


def newest_checkpoint(run: Any, warn: Warn | None = None) -> tuple[str, dict[str, Any]] | None:
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


def resume(
    r: Any,
    *,
    time_min: int | None = None,
    max_steps: int | None = None,
    nodes: int | None = None,
    args: tuple[str, ...] = (),
    warn: Warn = lambda _: None,
) -> dict[str, Any]:
    """Resubmit run `r` (hpctrain.runs.RunDir) from its newest verified checkpoint; the `resume`
    event as recorded in events.jsonl (time, event, job_id, previous_state, from_checkpoint, changes)."""
    from hpctrain import dispatch
    from hpctrain.profiles import Profile
    from hpctrain.render import render
    from hpctrain.request import JobRequest

    frozen = r.frozen()
    current = dispatch.state(r)
    if current in ACTIVE:
        raise UserError(
            f"{r.name} is {current} (job {r.last_job_id()}): it is still running and resumes "
            f"by itself after a preemption; to restart it, `hpctrain cancel {r.name}` first"
        )
    req = JobRequest.from_dict(frozen["request"])
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
    profile = Profile.model_validate(frozen["profile"])
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
        strategy = ckpt[1]["strategy"] if ckpt else req.strategy
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
        from hpctrain.kernel.errors import ValidationError

        raise ValidationError(problems)
    if changes:  # the script changes with the request; both are re-frozen, the old script kept
        stamp = time.strftime("%Y%m%d-%H%M%S")
        from hpctrain.runs import copy_aside

        copy_aside(r.job_sh, f"job.sh.before-resume-{stamp}")  # never over an earlier one
        r.write_script(render(profile, new, r.path))
        frozen["request"] = new.to_dict()
        frozen.setdefault("resumes", []).append({"time": stamp, "changes": changes})
        r.freeze(frozen)
    job_id = resubmit(r, profile, time_min=new.time_min)
    record = r.event(
        "resume",
        job_id=job_id,
        previous_state=current,
        from_checkpoint=ckpt[0] if ckpt else None,
        changes=changes,
    )
    return dict(record)


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


def preempt(r: Any, sig: str | None = None) -> tuple[str, str]:
    """Send run `r` its preemption signal the way the scheduler would: (signal name, target)."""
    from hpctrain import dispatch
    from hpctrain.procs import PREEMPT_SIGNALS

    frozen = r.frozen()
    name = (sig or frozen.get("profile", {}).get("preemption", {}).get("signal") or "USR2").upper()
    name = name.removeprefix("SIG")
    if name not in PREEMPT_SIGNALS:
        raise UserError(
            f"--signal {sig}: not a signal preempt sends; use one of "
            f"{', '.join(PREEMPT_SIGNALS)} (USR2, the default, is what Slurm sends)"
        )
    current = dispatch.state(r)
    if current != "RUNNING":
        raise UserError(f"{r.name} is {current}, not RUNNING: only a running job can be preempted")
    return name, dispatch.signal(r, name)
