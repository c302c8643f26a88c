"""`hpctrain preempt`: thin over hpctrain.service.preempt (moved from cli/resume.py)."""

from __future__ import annotations

from pathlib import Path

import click

from hpctrain.cli.complete import run_names
from hpctrain.kernel.errors import UserError
from hpctrain.remote.forward import maybe_forward
from hpctrain.runs import sweepdir
from hpctrain.runs.folder import find_run
from hpctrain.service.preempt import preempt as send


@click.command()
@click.argument("run", shell_complete=run_names)
@click.option(
    "--signal",
    "sig",
    help="Signal to send: USR2, USR1, HUP, INT, URG or TERM "
    "(default: the profile's preemption.signal).",
)
@click.option(
    "--runs-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to look for runs by name (default ./runs, then the run index).",
)
def preempt(run: str, sig: str | None, runs_dir: Path | None) -> None:
    """Send a run the preemption signal the way the scheduler would, to rehearse a preemption:
    the job saves a checkpoint at the next step boundary, exits 75 and requeues itself.

    \b
    Slurm: scancel --batch --signal=USR2 <job id>; local: kill -USR2 <script pid>.
    Example:
      hpctrain preempt demo
    """
    maybe_forward("preempt", run, runs_dir)

    if sweepdir.find(run, runs_dir) is not None:
        raise UserError(f"{run} is a sweep: preempt one point, e.g. `hpctrain preempt {run}/0`")

    r = find_run(run, runs_dir)
    name, target = send(r, sig)
    click.echo(
        f"sent SIG{name} to {target}; {r.name} saves at the next step boundary, exits 75 and "
        f"requeues. Follow: hpctrain status {r.name}"
    )
