"""`hpctrain resume`: thin over hpctrain.service.resume. No torch here: training runs in the
processes the scheduler starts."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import click

from hpctrain.cli.complete import run_names
from hpctrain.kernel import states
from hpctrain.remote.forward import maybe_forward
from hpctrain.runs import sweepdir
from hpctrain.runs.folder import RunDir, find_run
from hpctrain.runs.progress import describe, snapshot
from hpctrain.service import points
from hpctrain.service import resume as service
from hpctrain.service import sweep as sweeps
from hpctrain.service.submit import wait as wait_job

_runs_dir_option = click.option(
    "--runs-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to look for runs by name (default ./runs, then the run index).",
)


def _warn(msg: str) -> None:
    click.echo(f"warning: {msg}", err=True)


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("run", shell_complete=run_names)
@click.option(
    "--wait", is_flag=True, help="Block until the job ends; exit 1 if it did not complete."
)
@click.option("--time", "-t", "time_min", type=int, help="New time limit in minutes.")
@click.option("--max-steps", type=int, help="Train to this many steps (more than before).")
@click.option(
    "--nodes",
    "-N",
    type=int,
    help="Another node count (DDP/FSDP only: their checkpoints reshard; DeepSpeed's do not).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the resubmission as JSON.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Say what would resume (a sweep: which points, and the job array's --array line); "
    "write nothing.",
)
@_runs_dir_option
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def resume(
    run: str,
    wait: bool,
    time_min: int | None,
    max_steps: int | None,
    nodes: int | None,
    as_json: bool,
    dry_run: bool,
    runs_dir: Path | None,
    args: tuple[str, ...],
) -> None:
    """Resubmit a cancelled, failed, timed-out or preempted run into its own folder: same frozen
    profile and script, training continues from the newest verified checkpoint. Arguments after
    `--` are appended to the entry's arguments. A sweep: every point that stopped before finishing,
    on Slurm as one job array of only their indexes; finished points are not touched.

    \b
    Examples:
      hpctrain resume demo
      hpctrain resume demo --time 240 --wait
      hpctrain resume demo --max-steps 2000 --nodes 2     # DDP/FSDP: fewer nodes reshard
      hpctrain resume demo -- --optim.lr=1e-4
      hpctrain resume lr --dry-run     # a sweep: its unfinished points, as one job array
    """
    maybe_forward("resume", run, runs_dir)

    found = sweepdir.find(run, runs_dir)
    if found is not None and sweepdir.read(found).get("scheduler") == "local":
        _resume_local_sweep(found, dry_run=dry_run)
        return
    if found is not None:  # every point that stopped before finishing, as one job array
        out = service.resume_sweep(
            found,
            time_min=time_min,
            max_steps=max_steps,
            nodes=nodes,
            args=args,
            dry_run=dry_run,
            warn=_warn,
        )
        if as_json:
            click.echo(json.dumps(dataclasses.asdict(out), indent=2))
        else:
            _say_sweep(out, dry_run=dry_run)
        return

    r = find_run(run, runs_dir)
    if dry_run:
        p = service.plan(
            r, time_min=time_min, max_steps=max_steps, nodes=nodes, args=args, warn=_warn
        )
        origin = p.checkpoint.name if p.checkpoint else "the start (no verified checkpoint yet)"
        click.echo(
            f"would resume {r.name} (was {p.previous_state}) from {origin}"
            + (f"\n  changes: {json.dumps(p.changes)}" if p.changes else "")
            + "\nnothing was written"
        )
        return
    done = service.resume(
        r, time_min=time_min, max_steps=max_steps, nodes=nodes, args=args, warn=_warn
    )
    if as_json:
        click.echo(json.dumps(done.to_json() | {"name": r.name, "path": str(r.path)}, indent=2))
    else:
        _say_resumed(r, done)
    if wait:
        final = wait_job(r, on_change=lambda s: click.echo(f"  {_clock()} {s}", err=True))
        click.echo(f"{r.name}: {final}  {describe(snapshot(r))}")
        if final != states.COMPLETED:
            sys.exit(1)


def _resume_local_sweep(found: Path, *, dry_run: bool) -> None:
    """Local profile: a new runner for the points that did not finish."""
    if dry_run:
        left = [p for p in points.table(found) if p.state in sweeps.RESUMABLE]
        for row in left:
            click.echo(f"  {row.index}  {row.point} ({row.state})")
        click.echo(f"sweep {found.name}: {len(left)} point(s) would run again; nothing was written")
        return
    n = sweeps.resume_local(found)
    click.echo(
        f"sweep {found.name}: {n} point(s) to run again, "
        f"{sweepdir.read(found).get('max_parallel') or 1} at a time (local runner)"
    )


def _say_sweep(out: service.SweepResumed, *, dry_run: bool) -> None:
    for pt in out.points:
        origin = pt.from_checkpoint or "the start (no verified checkpoint yet)"
        click.echo(f"  {pt.index}  {pt.point} ({pt.previous_state}): from {origin}")
    n = len(out.points)
    if not n:
        click.echo(f"sweep {out.sweep}: no point to resume (each is finished or still active)")
    elif dry_run:
        click.echo(f"sweep {out.sweep}: {n} point(s), one job array: {out.array_line}")
        click.echo("nothing was written")
    else:
        click.echo(
            f"sweep {out.sweep}: {n} point(s) resumed as array job {out.array_job} "
            f"({out.array_line})\n  follow: hpctrain status {out.sweep}"
        )


def _say_resumed(r: RunDir, done: service.Resumed) -> None:
    origin = (
        f"from {done.from_checkpoint} (verified): manifest, names and sizes checked here; "
        "each rank checks the digests of what it reads at start"
        if done.from_checkpoint
        else "from the start (no verified checkpoint yet)"
        if r.record().entry_kind == "train_entry"
        else "your script finds its own checkpoint (hpctrain's checkpoints/ has none)"
    )
    click.echo(
        f"resumed {r.name} (was {done.previous_state}): job {done.job_id}, {origin}"
        + (f"\n  changed: {json.dumps(done.changes)}" if done.changes else "")
        + f"\n  follow: hpctrain status {r.name}; hpctrain logs {r.name} --follow"
    )


def _clock() -> str:
    return time.strftime("%H:%M:%S")
