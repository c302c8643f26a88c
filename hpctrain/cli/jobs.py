"""render, submit: thin commands over hpctrain.service (prepare, submit). They parse and print;
the service layer writes and starts. Nothing here imports torch (tests/test_cli_jobs.py checks)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TypeVar

import click

from hpctrain.cli.complete import profile_names
from hpctrain.cli.types import Count
from hpctrain.jobs.options import JobOptions
from hpctrain.kernel import strategies as strategy_names
from hpctrain.service import submit as service
from hpctrain.service.prepare import Prepared, plan_args, resolve_profile  # noqa: F401  (sweep, tests)

Command = TypeVar("Command", bound=Callable[..., None])


# the options `render`, `submit` and `sweep` share (JobOptions' fields), in --help's order
_OPTIONS = [
    click.option(
        "--profile",
        "-p",
        shell_complete=profile_names,
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
    click.option("--gpu-type", help="Override slurm.gpu_type (e.g. A100: --gpus-per-node=A100:4)."),
    click.option(
        "--set",
        "sets",
        multiple=True,
        metavar="KEY=VALUE",
        help="Override any unlocked profile key, e.g. --set slurm.mem=0 (repeatable).",
    ),
    click.option(
        "--params", type=Count(), help="--strategy auto: the model's parameter count (7e9, 7B)."
    ),
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
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object on stdout and nothing else there (the text goes to stderr): "
    "name, run_dir, job_id, job_ids, profile, scheduler, where, topology, entry, time_min, "
    "total_steps, chain, moved_aside, dry_run; with --wait also state (the final one), "
    "progress and why (null, or the failure's kind, line and log).",
)
def submit(as_json: bool, **o: object) -> None:
    """Submit a training run: train_entry (or --script/--module) on N nodes x G GPUs under torchrun.
    Arguments after `--` go to the entry.

    \b
    Examples:
      hpctrain submit --profile mycluster --nodes 2 --gpus 8 --name gpt-small -- --max-steps 1000
      hpctrain submit --nodes 2 --gpus 1 --name demo --wait -- --max-steps 60   # local, no Slurm
      hpctrain submit --nodes 1 --gpus 2 --script train.py --name mine -- --lr 3e-4
      hpctrain submit --profile mysite-remote --script train.py --name exp1   # over SSH (docs/remote.md)
      hpctrain submit --profile mycluster --time 2880 --chain --name long   # past max_time_min

    \b
    For scripts, --json (add --wait for the end):
      job=$(hpctrain submit --json --name demo -- --max-steps 60 | jq -r .job_id)
      {"name": "demo", "run_dir": "/home/me/runs/demo", "job_id": "4242", "job_ids": ["4242"],
       "profile": "mycluster", "scheduler": "slurm", ..., "dry_run": false}
      with --wait: ... "state": "COMPLETED", "progress": {"step": 60, "total": 60, ...}, "why": null}
    """
    opts = JobOptions.of(o)
    say = _stderr if as_json else click.echo  # --json: stdout holds the JSON object only
    profile = resolve_profile(opts)
    if profile.login is not None and not opts.code:
        # lazy: CLI start-up: the SSH side (tunnel, packing, tarfile) only for a profile with login:
        from hpctrain.remote.submit import submit as remote_submit

        extra = ["--json"] if as_json else None  # the site prints the object
        sys.exit(remote_submit(opts, profile, echo=say, extra=extra))
    rec, run = service.submit(opts, profile)
    if opts.dry_run:
        _dry_run(rec, say)
        if as_json:
            click.echo(json.dumps(rec.to_json(), indent=2))
        return
    if rec.moved_aside is not None:
        say(
            f"{rec.name} had failed before its first step: its folder (logs) is now "
            f"{rec.moved_aside}"
        )
    if rec.chain:
        say(
            f"chain of {len(rec.chain)} jobs, each --time <= {rec.max_time_min} min, "
            "each waiting for the one before (afterany)"
        )
    say(
        f"submitted {rec.name}: job {rec.job_id} on {rec.where}, {rec.topology}, {rec.entry}\n"
        f"  run folder: {rec.run_path}\n"
        f"  follow: hpctrain status {rec.name}; hpctrain logs {rec.name} --follow"
    )
    if opts.wait:
        # lazy: CLI start-up: the follower and the failure reader for --wait only
        from hpctrain.cli.wait import wait_for

        wait_for(run, rec.name, total=rec.total_steps, record=rec if as_json else None)
    elif as_json:
        click.echo(json.dumps(rec.to_json(), indent=2))


def _stderr(text: str) -> None:
    click.echo(text, err=True)


def _dry_run(rec: service.Submitted, say: Callable[[str], None]) -> None:
    """The dry run's lines, through `say` (stderr with --json)."""
    say(
        f"dry run: would submit {rec.name} to {rec.where} with profile {rec.profile}\n"
        f"  topology: {rec.topology}, time {rec.time_min} min, {rec.entry}\n"
        f"  on failure: {rec.recovery}\n"
        + (f"  {rec.snapshots}\n" if rec.snapshots else "")
        + f"  run folder: {rec.run_path}\n  script: {rec.script_lines} lines "
        "(`hpctrain render` with the same options prints it)"
    )
    if rec.chain:
        say(
            f"  chain: {len(rec.chain)} jobs (--time {rec.chain_time_min} "
            f"> slurm.max_time_min {rec.max_time_min}), each resuming from the newest checkpoint"
        )
        for line in rec.chain:
            say(f"    {line}")
    say("  nothing was written")
