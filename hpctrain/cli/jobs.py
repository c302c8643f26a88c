"""render, submit: thin commands over hpctrain.service (prepare, submit). They parse and print;
the service layer writes and starts. Nothing here imports torch (tests/test_cli_jobs.py checks)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import click

from hpctrain.jobs.options import JobOptions
from hpctrain.kernel import states
from hpctrain.kernel import strategies as strategy_names
from hpctrain.runs.cause import root_cause
from hpctrain.runs.progress import Follower, describe, snapshot
from hpctrain.service import submit as service
from hpctrain.service.prepare import Prepared, plan_args, resolve_profile  # noqa: F401  (sweep, tests)
from hpctrain.service.submit import wait

if TYPE_CHECKING:
    from hpctrain.runs.folder import RunDir

Command = TypeVar("Command", bound=Callable[..., None])


# the options `render`, `submit` and `sweep` share (JobOptions' fields), in --help's order
_OPTIONS = [
    click.option(
        "--profile",
        "-p",
        help="Site profile name or YAML path (default: your config's "
        "default_profile, else `local` when sbatch is not on PATH).",
    ),
    click.option("--nodes", "-N", type=int, help="Number of nodes (default 1)."),
    click.option(
        "--min-nodes",
        type=int,
        help="Fewest nodes the run may train on (#SBATCH "
        "--nodes=MIN-N): Slurm may start it on fewer, and the preflight gate continues "
        "without a bad node (docs/bad-nodes.md). DDP/FSDP only.",
    ),
    click.option(
        "--spare-nodes",
        type=int,
        help="Hot spares (Slurm): the allocation holds K nodes more than training uses; a "
        "node the preflight gate finds bad, at the start or after a failed training step, "
        "is swapped for one in the same job (default: the profile's preemption.spare_nodes, "
        "docs/recovery.md).",
    ),
    click.option(
        "--exclude",
        multiple=True,
        metavar="NODES",
        help="Nodes Slurm must not give this run (#SBATCH --exclude), e.g. the list "
        "`hpctrain doctor --bisect` prints (repeatable, or comma-separated).",
    ),
    click.option(
        "--gpus",
        "-G",
        type=int,
        help="GPUs per node (local profile: CPU workers per "
        "simulated node). Default: all GPUs of a node, 1 locally.",
    ),
    click.option(
        "--time",
        "-t",
        "time_min",
        type=int,
        help="Time limit in minutes (default: the profile's slurm.default_time_min).",
    ),
    click.option(
        "--name", "-n", help="Run name = run folder name (default: <entry>-<date>-<time>)."
    ),
    click.option(
        "--strategy",
        "-s",
        type=click.Choice(strategy_names.CHOICES),
        help="Parallelism for train_entry (default ddp; auto: from `hpctrain plan`).",
    ),
    click.option(
        "--script",
        type=click.Path(dir_okay=False),
        help="Run your own script under torchrun instead of train_entry.",
    ),
    click.option(
        "--module", help="Run your own module (PKG.MOD) under torchrun instead of train_entry."
    ),
    click.option("--partition", help="Override slurm.partition."),
    click.option("--account", help="Override slurm.account."),
    click.option("--qos", help="Override slurm.qos."),
    click.option(
        "--set",
        "sets",
        multiple=True,
        metavar="KEY=VALUE",
        help="Override any unlocked profile key, e.g. --set slurm.mem=0 (repeatable).",
    ),
    click.option("--params", type=int, help="--strategy auto: the model's parameter count."),
    click.option("--model", "plan_model", help="--strategy auto: the model factory pkg.mod:fn."),
    click.argument("args", nargs=-1, type=click.UNPROCESSED),
]


def _job_options(f: Command) -> Command:
    for option in reversed(_OPTIONS):
        f = option(f)
    return f


@click.command()
@_job_options
def render(**o: object) -> None:
    """Print the batch script that `submit` would hand to the scheduler, byte for byte.

    \b
    Example:
      hpctrain render --profile loopback --nodes 2 --gpus 2 --name demo -- --max-steps 60
    """
    prepared = Prepared(JobOptions.of(o))
    click.echo(prepared.script, nl=False)


@click.command()
@_job_options
@click.option(
    "--wait", is_flag=True, help="Block until the job ends; exit 1 if it did not complete."
)
@click.option(
    "--dry-run", is_flag=True, help="Validate and render, say where it would go, write nothing."
)
@click.option(
    "--replace-finished",
    is_flag=True,
    help="If a COMPLETED run has this name, move its folder aside to NAME.old-<time> and start again.",
)
@click.option(
    "--sync",
    type=click.Path(file_okay=False, exists=True),
    help="Remote site (profile with login:): send this folder as the run's code/ instead of "
    "the committed tree of your --script's (or --module's) git repository.",
)
@click.option(
    "--chain",
    is_flag=True,
    help="--time above the profile's slurm.max_time_min: submit ceil(time / max) jobs that run "
    "one after another (afterany), each resuming from the newest checkpoint.",
)
@click.option(
    "--code",
    type=click.Path(file_okay=False, exists=True),
    hidden=True,
    help="On the site: the uploaded code folder, moved into the run folder as code/.",
)
def submit(**o: object) -> None:
    """Submit a training run: train_entry (or --script/--module) on N nodes x G GPUs under torchrun.
    Arguments after `--` go to the entry.

    \b
    Examples:
      hpctrain submit --profile mycluster --nodes 2 --gpus 8 --name gpt-small -- --max-steps 1000
      hpctrain submit --nodes 2 --gpus 1 --name demo --wait -- --max-steps 60   # local, no Slurm
      hpctrain submit --nodes 1 --gpus 2 --script train.py --name mine -- --lr 3e-4
      hpctrain submit --profile mysite-remote --script train.py --name exp1   # over SSH (docs/remote.md)
      hpctrain submit --profile mycluster --time 2880 --chain --name long   # past max_time_min
    """
    opts = JobOptions.of(o)
    profile = resolve_profile(opts)
    if profile.login is not None and not opts.code:
        # lazy: CLI start-up: the SSH side (tunnel, packing, tarfile) only for a profile with login:
        from hpctrain.remote.submit import submit as remote_submit

        sys.exit(remote_submit(opts, profile, echo=click.echo))
    rec, run = service.submit(opts, profile)
    if opts.dry_run:
        click.echo(
            f"dry run: would submit {rec.name} to {rec.where} with profile {rec.profile}\n"
            f"  topology: {rec.topology}, time {rec.time_min} min, {rec.entry}\n"
            f"  on failure: {rec.recovery}\n"
            + (f"  {rec.snapshots}\n" if rec.snapshots else "")
            + f"  run folder: {rec.run_path}\n  script: {rec.script_lines} lines "
            "(`hpctrain render` with the same options prints it)"
        )
        if rec.chain:
            click.echo(
                f"  chain: {len(rec.chain)} jobs (--time {rec.chain_time_min} "
                f"> slurm.max_time_min {rec.max_time_min}), each resuming from the newest checkpoint"
            )
            for line in rec.chain:
                click.echo(f"    {line}")
        click.echo("  nothing was written")
        return
    if rec.moved_aside is not None:
        click.echo(
            f"{rec.name} had failed before its first step: its folder (logs) is now "
            f"{rec.moved_aside}"
        )
    if rec.chain:
        click.echo(
            f"chain of {len(rec.chain)} jobs, each --time <= {rec.max_time_min} min, "
            "each waiting for the one before (afterany)"
        )
    click.echo(
        f"submitted {rec.name}: job {rec.job_id} on {rec.where}, {rec.topology}, {rec.entry}\n"
        f"  run folder: {rec.run_path}\n"
        f"  follow: hpctrain status {rec.name}; hpctrain logs {rec.name} --follow"
    )
    if opts.wait:
        wait_for(run, rec.name, total=rec.total_steps)


def wait_for(run: RunDir, name: str, *, total: int | None) -> None:
    """Follow the job to its end: state and training progress; on failure, why and where."""
    follow = Follower(run, total=total, out=lambda s: click.echo(s, err=True))
    try:
        final = wait(run, on_poll=follow)
    except KeyboardInterrupt:
        follow.close()
        click.echo(
            f"\nstopped waiting; {name} keeps running (`hpctrain cancel {name}` stops it)", err=True
        )
        sys.exit(130)
    follow.close()
    click.echo(f"{name}: {final}  {describe(snapshot(run, total))}")
    if final != states.COMPLETED:
        cause = root_cause(run.path)
        if cause:
            click.echo(f"  why: {cause.line}\n  full log: {cause.log}", err=True)
        else:
            click.echo(
                f"  no error line found; logs: {run.logs} (`hpctrain logs {name}`)", err=True
            )
        sys.exit(1)
