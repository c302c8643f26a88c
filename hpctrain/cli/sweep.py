"""`hpctrain sweep`: a grid of entry arguments as one job array (thin: the work is in
hpctrain/service/sweep.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from hpctrain.cli.jobs import _job_options
from hpctrain.cli.table import plain_table
from hpctrain.jobs.options import JobOptions
from hpctrain.runs import sweepdir
from hpctrain.service import sweep as sweeps
from hpctrain.service.prepare import resolve_profile


@click.command()
@_job_options
@click.option(
    "--grid",
    "grid",
    multiple=True,
    metavar="KEY=V1,V2,...",
    help="One axis of the grid: the entry gets --KEY=V for each value (repeatable; the "
    "sweep is the product of every axis).",
)
@click.option(
    "--max-parallel",
    type=int,
    help="At most K points at once (Slurm: --array=0-N%K; local: default 1, one after another).",
)
@click.option("--dry-run", is_flag=True, help="Print the grid and the array script; write nothing.")
@click.option(
    "--sync",
    type=click.Path(file_okay=False, exists=True),
    help="Remote site: send this folder as the code instead of the git repository's HEAD.",
)
@click.option("--code", type=click.Path(file_okay=False, exists=True), hidden=True)
def sweep(**o: object) -> None:
    """Run the product of a grid of entry arguments: one run folder per point (NAME/<i>-<k=v,...>),
    one Slurm job array (`--array=0-N[%K]`). Each point is frozen, resumable and preemptible on
    its own; address one as NAME/<i>. Arguments after `--` go to every point.

    \b
    Examples:
      hpctrain sweep --profile mycluster --name lr --grid optim.lr=1e-3,3e-4,1e-4 -- --max-steps 500
      hpctrain sweep --name bs --grid train.seed=1,2 --grid optim.lr=1e-3,1e-4 --max-parallel 2
      hpctrain sweep --name lr --grid optim.lr=1e-3,1e-4 --dry-run   # grid and array script
      hpctrain status lr; hpctrain logs lr/1; hpctrain preempt lr/0; hpctrain resume lr
    """
    opts = JobOptions.of(o)
    profile = resolve_profile(opts)
    if profile.login is not None and not opts.code:
        extra = [x for g in opts.grid for x in ("--grid", g)]
        if opts.max_parallel is not None:
            extra += ["--max-parallel", str(opts.max_parallel)]
        # lazy: CLI start-up: the SSH side (tunnel, packing, tarfile) only for a profile with login:
        from hpctrain.remote.submit import submit as remote_submit

        sys.exit(remote_submit(opts, profile, command="sweep", extra=extra, echo=click.echo))
    code = Path(opts.code) if opts.code else None
    plan = sweeps.prepare(opts, profile, code)
    rows = [[str(p.index), p.folder, " ".join(p.args())] for p in plan.points]

    where = (
        "one Slurm job array"
        if plan.array
        else (f"this machine, {plan.max_parallel or 1} at a time (local executor)")
    )
    click.echo(
        f"sweep {plan.name}: {len(plan.points)} points on {where}\n  folder: {plan.sweep_dir}"
    )
    click.echo(plain_table(["index", "point", "entry arguments added"], rows), nl=False)
    if opts.dry_run:
        if plan.array:
            click.echo(f"==> {plan.sweep_dir / sweepdir.ARRAY_FILE} <==\n{plan.array}", nl=False)
        click.echo("nothing was written")
        return
    job = sweeps.create_and_submit(plan, code)
    what = f"array job {job}" if plan.array else f"local runner pid {job}"
    click.echo(
        f"submitted {plan.name}: {what}\n  follow: hpctrain status {plan.name}; "
        f"hpctrain logs {plan.name}/0 --follow"
    )
