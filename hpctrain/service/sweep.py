"""Sweeps: the product of a grid of entry arguments, one run folder per point, one Slurm job array.

    runs/NAME/sweep.json            the grid, the points and the array job id
    runs/NAME/array.sh              Slurm: the array script (what sbatch got)
    runs/NAME/<i>-<key=value,...>/  point i: a run folder like any other (run.yaml, job.sh, ...)

Each point is frozen, resumable and preemptible on its own: array task i runs point i's own job.sh
(`exec`, so the batch shell that Slurm signals is job.sh's, with its traps); the script requeues
itself with `scontrol requeue $SLURM_JOB_ID`, the task's own id, so only that task runs again. A
point is addressed as NAME/<i> or NAME/<folder>; its jobs.jsonl records `<array id>_<i>`. The
local profile runs the points with a detached runner, `--max-parallel` at a time (default one after
another).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import shutil
import subprocess
import sys
import time as _time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.jobs import entry_check
from hpctrain.jobs.options import JobOptions
from hpctrain.jobs.request import NAME_RE, NAME_RULE, JobRequest
from hpctrain.jobs.spec import JobSpec, node_python
from hpctrain.kernel import states, strategies
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.rundir import RunFolder
from hpctrain.render.script import render
from hpctrain.runs.folder import RunDir, runs_dir_of
from hpctrain.runs.sweepdir import KIND, is_sweep, read, record, write, write_array
from hpctrain.service.points import table
from hpctrain.service.upload import check_upload

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile

# Point states `resume SWEEP` brings back (a point never started locally shows WAITING).
RESUMABLE = states.RESUMABLE
MAX_POINTS = 10_000  # a grid's product is checked before any point is built
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}\Z")
_VALUE = re.compile(r"[A-Za-z0-9_.+:-]{1,64}\Z")


@dataclass(frozen=True)
class Point:
    index: int
    values: tuple[tuple[str, str], ...]

    @property
    def folder(self) -> str:
        return f"{self.index}-" + ",".join(f"{k}={v}" for k, v in self.values)

    def args(self) -> list[str]:
        return [f"--{k}={v}" for k, v in self.values]


def parse_grid(items: tuple[str, ...] | list[str]) -> list[tuple[str, list[str]]]:
    """`--grid KEY=V1,V2` items -> [(key, [values])], every problem raised at once."""
    grid: list[tuple[str, list[str]]] = []
    problems = []
    for item in items:
        key, sep, values = item.partition("=")
        key = key.removeprefix("--")
        vals = [v for v in values.split(",")] if sep else []
        if not sep or not _KEY.match(key) or not vals:
            problems.append(
                f"--grid {item!r}: write KEY=V1,V2,... (KEY an entry option such as "
                "optim.lr, without the leading --)"
            )
            continue
        bad = [v for v in vals if not _VALUE.match(v)]
        if bad:
            problems.append(
                f"--grid {item!r}: value {bad[0]!r} has characters a folder name cannot "
                "carry; use letters, digits and . _ + : -"
            )
            continue
        if any(k == key for k, _ in grid):
            problems.append(f"--grid {key} is given twice; give each key once with all its values")
            continue
        grid.append((key, vals))
    if not items:
        problems.append("a sweep needs at least one --grid KEY=V1,V2,...")
    count = 1
    for _, vals in grid:
        count *= len(vals)
    if count > MAX_POINTS:
        sizes = " x ".join(str(len(v)) for _, v in grid)
        problems.append(
            f"the grid has {count} points ({sizes}), more than {MAX_POINTS}: a sweep is one Slurm "
            "array (MaxArraySize is 1001 by default); split it into several sweeps"
        )
    if problems:
        raise UserError("\n".join(problems))
    return grid


def points(grid: list[tuple[str, list[str]]]) -> list[Point]:
    keys = [k for k, _ in grid]
    combos = itertools.product(*[vals for _, vals in grid])
    return [Point(i, tuple(zip(keys, combo, strict=True))) for i, combo in enumerate(combos)]


def array_spec(n: int, max_parallel: int | None) -> str:
    return f"0-{n - 1}" + (f"%{max_parallel}" if max_parallel else "")


def resume_spec(indexes: list[int], max_parallel: int | None) -> str:
    """`--array=` of only these points (`resume SWEEP`): `1,3,4`, or `1,3,4%2`."""
    return ",".join(str(i) for i in sorted(indexes)) + (f"%{max_parallel}" if max_parallel else "")


def array_script(
    name: str, sweep_dir: Path, directives: list[str], folders: list[Path], spec: str
) -> str:
    """The job array's batch script: point i's own resources, then `exec bash` its job.sh."""
    keep = [d for d in directives if not d.startswith(("--job-name=", "--output=", "--error="))]
    head = [
        f"--job-name={name}",
        *keep,
        f"--output={sweep_dir}/logs/array-%a.log",
        f"--array={spec}",
    ]
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in head),
        f"# hpctrain sweep {name}: array task i runs point i's own job.sh in its own run folder.",
        "# exec: the batch shell that Slurm signals (preemption, time limit) is job.sh's.",
        "set -u",
        "points=(" + " ".join(_quoted(str(f)) for f in folders) + ")",
        "point=${points[$SLURM_ARRAY_TASK_ID]}",
        'exec >>"$point/logs/batch.log" 2>&1',
        'exec bash "$point/job.sh"',
        "",
    ]
    return "\n".join(lines)


def _quoted(text: str) -> str:
    """Always single-quoted (shlex leaves `a,b` bare, which shellcheck reads as a mistake)."""
    return "'" + text.replace("'", "'\\''") + "'"


# -- submitting -----------------------------------------------------------------------------------
def sbatch_array(sweep_dir: Path, script: str) -> str:
    """Slurm: one sbatch of an array script; the array's job id."""
    # lazy: CLI start-up: Slurm's module for an array only (never for --dry-run or a local sweep)
    from hpctrain.dispatch.slurm import sbatch

    return sbatch(sweep_dir / "submitit", script, what="the job array").split("_")[0]


def submit_array(sweep_dir: Path, script: str, runs: list[RunDir], pts: list[Point]) -> str:
    """Slurm: one sbatch of the array script; every point records `<array>_<i>`."""
    array_id = sbatch_array(sweep_dir, script)
    for run, p in zip(runs, pts, strict=True):
        run.add_job(f"{array_id}_{p.index}", kind=KIND, scheduler="slurm")
    return array_id


def start_local(sweep_dir: Path) -> int:
    """Local profile: a detached runner starts the points, max_parallel at a time."""
    log = RunFolder(sweep_dir).open_log("logs/runner.log")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain.service.sweep_runner", str(sweep_dir)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=dict(os.environ),
    )
    log.close()
    return proc.pid


def resume_local(sweep_dir: Path) -> int:
    """Local profile: a new runner for the points that did not finish (the same job.sh each:
    train_entry resumes from the newest checkpoint); returns how many it will run."""
    left = [r for r in table(sweep_dir) if r.state in RESUMABLE]
    if left:
        data = read(sweep_dir)
        write(sweep_dir, {**data, "runner_pid": start_local(sweep_dir)})
    return len(left)


@dataclass
class Planned:
    """A sweep ready to be written and submitted (sweep --dry-run prints it)."""

    name: str
    sweep_dir: Path
    profile: ResolvedProfile
    grid: list[tuple[str, list[str]]]
    points: list[Point]
    requests: list[JobRequest]
    scripts: list[str]
    python: str
    max_parallel: int | None
    array: str | None  # the array script (Slurm)


def _sweep_dir(o: JobOptions, profile: ResolvedProfile) -> tuple[str, Path]:
    name = o.name or f"sweep-{_time.strftime('%Y%m%d-%H%M%S')}"
    if not NAME_RE.match(name) or len(name) > 56:
        raise UserError(f"--name {name!r} is not a valid sweep name ({NAME_RULE}, at most 56)")
    if o.max_parallel is not None and o.max_parallel < 1:
        raise UserError(f"--max-parallel {o.max_parallel}: at least 1")
    sweep_dir = runs_dir_of(profile) / name
    if sweep_dir.exists():
        hint = (
            f"`hpctrain resume {name}` continues its unfinished points"
            if is_sweep(sweep_dir)
            else "move that folder away"
        )
        raise UserError(f"{sweep_dir} already exists; choose another --name, or {hint}")
    return name, sweep_dir


def _point_request(
    o: JobOptions,
    profile: ResolvedProfile,
    point: Point,
    *,
    name: str,
    strategy: str | None,
    ours: bool,
    code_dir: Path | None,
) -> JobRequest:
    """One point's request, its config checked at the requested world size (train_entry)."""
    args = (*o.args, *point.args())
    req = JobRequest.build(
        profile,
        name=f"{name}-{point.index}",
        nodes=o.nodes,
        gpus=o.gpus,
        time_min=o.time_min,
        strategy=strategy,
        script=o.script,
        module=o.module,
        args=args,
        min_nodes=o.min_nodes,
        exclude=tuple(o.exclude or ()),
    )
    if ours:  # before anything is queued
        try:
            resolved = entry_check.check_train_entry(
                nodes=req.nodes,
                gpus=req.gpus,
                args=args,
                strategy=strategy,
                domain=profile.slurm.gpus_per_domain,
            )
        except UserError as e:
            raise UserError(f"point {point.folder}: {e.message}") from None
        if resolved["strategy"] != req.strategy:
            req = req.with_strategy(resolved["strategy"])
    if code_dir is not None and req.entry.kind == "script":
        rel = Path(req.entry.target).resolve().relative_to(code_dir.resolve())
        sweep_dir = runs_dir_of(profile) / name
        entry = dataclasses.replace(req.entry, target=str(sweep_dir / "code" / rel))
        req = dataclasses.replace(req, entry=entry)
    return req


def prepare(o: JobOptions, profile: ResolvedProfile, code_dir: Path | None = None) -> Planned:
    if code_dir is not None:  # before anything is written: --code is moved, never any folder
        check_upload(code_dir, o.script)
    grid = parse_grid(o.grid)
    pts = points(grid)
    name, sweep_dir = _sweep_dir(o, profile)
    python = node_python(profile)
    ours = not (o.script or o.module)  # the bundled train_entry
    strategy = o.strategy
    if strategy == strategies.AUTO:
        raise UserError(
            "sweep --strategy auto is not supported: choose ddp, fsdp or deepspeed "
            "(`hpctrain plan` says which)"
        )
    if ours:  # the grid's keys become entry flags too (`--grid run-dir=...` is refused)
        entry_check.refuse_owned((*o.args, *(f"--{k}=" for k, _ in grid)))
        strategy = entry_check.one_source(strategy, tuple(o.args))
    requests = [
        _point_request(o, profile, p, name=name, strategy=strategy, ours=ours, code_dir=code_dir)
        for p in pts
    ]
    specs = [
        JobSpec.build(profile, req, sweep_dir / p.folder, python=python)
        for p, req in zip(pts, requests, strict=True)
    ]
    array = None
    if profile.scheduler == "slurm":
        array = array_script(
            name,
            sweep_dir,
            list(specs[0].directives),
            [sweep_dir / p.folder for p in pts],
            array_spec(len(pts), o.max_parallel),
        )
    return Planned(
        name=name,
        sweep_dir=sweep_dir,
        profile=profile,
        grid=grid,
        points=pts,
        requests=requests,
        scripts=[render(spec) for spec in specs],
        python=python,
        max_parallel=o.max_parallel,
        array=array,
    )


def create_and_submit(plan: Planned, code_dir: Path | None = None) -> str:
    """Write the sweep folder and every point's run folder, then submit; returns the job id
    (Slurm: the array's) or the local runner's pid."""
    plan.sweep_dir.mkdir(parents=True)
    (plan.sweep_dir / "logs").mkdir()
    if code_dir is not None:
        shutil.move(str(code_dir), str(plan.sweep_dir / "code"))
    runs = []
    for p, req, script in zip(plan.points, plan.requests, plan.scripts, strict=True):
        run = RunDir(plan.sweep_dir / p.folder)
        run.create(profile=plan.profile, request=req, script=script, node_python=plan.python)
        runs.append(run)
    data = {
        "name": plan.name,
        "scheduler": plan.profile.scheduler,
        "grid": [[k, v] for k, v in plan.grid],
        "max_parallel": plan.max_parallel,
        "points": [
            {"index": p.index, "folder": p.folder, "values": dict(p.values)} for p in plan.points
        ],
    }
    write(plan.sweep_dir, data)
    record(plan.name, plan.sweep_dir)
    if plan.array is not None:
        write_array(plan.sweep_dir, plan.array)
        job = submit_array(plan.sweep_dir, plan.array, runs, plan.points)
        write(plan.sweep_dir, {**data, "array_job": job})
        return job
    write(plan.sweep_dir, {**data, "runner_pid": None})
    pid = start_local(plan.sweep_dir)
    write(plan.sweep_dir, {**data, "runner_pid": pid})
    return str(pid)
