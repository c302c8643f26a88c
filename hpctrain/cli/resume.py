"""resume, preempt, check-resume: thin commands over hpctrain.service (resume, check_resume).
No torch here: training and checkpoint comparison run in subprocesses the service starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.errors import UserError

_runs_dir_option = click.option(
    "--runs-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to look for runs by name (default ./runs, then the run index).",
)


def _warn(msg: str) -> None:
    click.echo(f"warning: {msg}", err=True)


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("run")
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
    from hpctrain.remote.forward import maybe_forward

    maybe_forward("resume", run, runs_dir)
    from hpctrain import sweep as sweeps
    from hpctrain import sweepdir

    found = sweepdir.find(run, runs_dir)
    if found is not None and sweepdir.read(found).get("scheduler") == "local":
        if dry_run:
            left = [r for r in sweeps.table(found) if r["state"] in sweeps.RESUMABLE]
            for row in left:
                click.echo(f"  {row['index']}  {row['point']} ({row['state']})")
            click.echo(
                f"sweep {found.name}: {len(left)} point(s) would run again; nothing was written"
            )
            return
        n = sweeps.resume_local(found)
        click.echo(
            f"sweep {found.name}: {n} point(s) to run again, "
            f"{sweepdir.read(found).get('max_parallel') or 1} at a time (local runner)"
        )
        return
    from hpctrain.service import resume as service

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
            click.echo(json.dumps(out, indent=2))
            return
        for pt in out["points"]:
            origin = pt["from_checkpoint"] or "the start (no verified checkpoint yet)"
            click.echo(f"  {pt['index']}  {pt['point']} ({pt['previous_state']}): from {origin}")
        n = len(out["points"])
        if not n:
            click.echo(f"sweep {found.name}: no point to resume (each is finished or still active)")
        elif dry_run:
            click.echo(f"sweep {found.name}: {n} point(s), one job array: {out['array_line']}")
            click.echo("nothing was written")
        else:
            click.echo(
                f"sweep {found.name}: {n} point(s) resumed as array job {out['array_job']} "
                f"({out['array_line']})\n  follow: hpctrain status {found.name}"
            )
        return
    from hpctrain.runs import find_run

    r = find_run(run, runs_dir)
    if dry_run:
        p = service.plan(
            r, time_min=time_min, max_steps=max_steps, nodes=nodes, args=args, warn=_warn
        )
        origin = p.checkpoint[0] if p.checkpoint else "the start (no verified checkpoint yet)"
        click.echo(
            f"would resume {r.name} (was {p.previous_state}) from {origin}"
            + (f"\n  changes: {json.dumps(p.changes)}" if p.changes else "")
            + "\nnothing was written"
        )
        return
    record = service.resume(
        r, time_min=time_min, max_steps=max_steps, nodes=nodes, args=args, warn=_warn
    )
    current_was, changes, ckpt = (
        record["previous_state"],
        record["changes"],
        record["from_checkpoint"],
    )
    if as_json:
        click.echo(json.dumps(record | {"name": r.name, "path": str(r.path)}, indent=2))
    else:
        origin = (
            f"from {ckpt} (verified)" if ckpt else "from the start (no verified checkpoint yet)"
        )
        click.echo(
            f"resumed {r.name} (was {current_was}): job {record['job_id']}, {origin}"
            + (f"\n  changed: {json.dumps(changes)}" if changes else "")
            + f"\n  follow: hpctrain status {r.name}; hpctrain logs {r.name} --follow"
        )
    if wait:
        from hpctrain.service.submit import wait as wait_job

        final = wait_job(r, on_change=lambda s: click.echo(f"  {_clock()} {s}", err=True))
        click.echo(f"{r.name}: {final}")
        if final != "COMPLETED":
            sys.exit(1)


def _clock() -> str:
    import time

    return time.strftime("%H:%M:%S")


@click.command()
@click.argument("run")
@click.option(
    "--signal",
    "sig",
    help="Signal to send: USR2, USR1, HUP, INT, URG or TERM "
    "(default: the profile's preemption.signal).",
)
@_runs_dir_option
def preempt(run: str, sig: str | None, runs_dir: Path | None) -> None:
    """Send a run the preemption signal the way the scheduler would, to rehearse a preemption:
    the job saves a checkpoint at the next step boundary, exits 75 and requeues itself.

    \b
    Slurm: scancel --batch --signal=USR2 <job id>; local: kill -USR2 <script pid>.
    Example:
      hpctrain preempt demo
    """
    from hpctrain.remote.forward import maybe_forward

    maybe_forward("preempt", run, runs_dir)
    from hpctrain import sweepdir

    if sweepdir.find(run, runs_dir) is not None:
        raise UserError(f"{run} is a sweep: preempt one point, e.g. `hpctrain preempt {run}/0`")
    from hpctrain.runs import find_run
    from hpctrain.service.resume import preempt as send

    r = find_run(run, runs_dir)
    name, target = send(r, sig)
    click.echo(
        f"sent SIG{name} to {target}; {r.name} saves at the next step boundary, exits 75 and "
        f"requeues. Follow: hpctrain status {r.name}"
    )


@click.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--strategy",
    "-s",
    type=click.Choice(strategy_names.NAMES),
    default=strategy_names.DEFAULT,
    show_default=True,
    help="Strategy to check.",
)
@click.option("--steps", type=int, default=6, show_default=True, help="Steps of each short run.")
@click.option("--stop-at", type=int, help="Interrupt at this step (default: half of --steps).")
@click.option("--nproc", type=int, default=2, show_default=True, help="Local ranks (torchrun).")
@click.option(
    "--keep",
    "keep_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the two runs in this folder (default: a temporary one, removed on success).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def check_resume(
    strategy: str,
    steps: int,
    stop_at: int | None,
    nproc: int,
    keep_dir: Path | None,
    as_json: bool,
    args: tuple[str, ...],
) -> None:
    """Prove that interrupting and resuming your config is bit-exact, on this machine (CPU, gloo).

    Trains --steps uninterrupted; trains again, stops at --stop-at through the preemption flag
    (checkpoint, exit 75) and resumes; compares final_params.sha256. When they differ, it compares
    the two runs' checkpoints step by step and names the first step and the state that differed
    (model, optimizer, RNG, data position, scheduler). Arguments after `--` go to train_entry.

    \b
    Examples:
      hpctrain check-resume
      hpctrain check-resume --strategy fsdp --steps 8 -- --model mypkg.model:build --data mypkg.data:build
    """
    from hpctrain.service.check_resume import check_resume as check

    def say(msg: str) -> None:
        if not as_json:
            click.echo(msg, err=True)

    verdict = check(strategy, steps, stop_at, nproc, keep_dir, args, say=say)
    a, b, stop, base = (
        verdict[k] for k in ("uninterrupted_sha256", "resumed_sha256", "stopped_at", "folder")
    )
    if as_json:
        click.echo(json.dumps(verdict, indent=2))
    elif verdict["identical"]:
        click.echo(
            f"bit-identical: interrupted at step {stop} and resumed, {strategy} x {nproc} ranks "
            f"ends with the same parameters as the uninterrupted run (sha256 {a[:16]}...)"
        )
    else:
        diff = verdict["first_difference"]
        click.echo(f"NOT identical: uninterrupted {a[:16]}... vs resumed {b[:16]}...")
        if diff:
            click.echo(
                f"  first differing checkpoint: step {diff['step']}: {', '.join(diff['differs'])}"
            )
            click.echo(f"  hint: {diff['hint']}")
        click.echo(f"  runs kept in {base}")
    if not verdict["identical"]:
        sys.exit(1)
