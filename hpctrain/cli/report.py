"""hpctrain report: plots and a cost summary of one run, or two overlaid."""

from __future__ import annotations

import json
from pathlib import Path

import click

from hpctrain.cli.complete import run_names
from hpctrain.cli.runs import show
from hpctrain.remote.forward import maybe_forward
from hpctrain.report.service import build
from hpctrain.report.summary import text
from hpctrain.runs import sweepdir


@click.command()
@click.argument("runs", nargs=-1, required=True, shell_complete=run_names)
@click.option(
    "--runs-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to look for runs by name (default ./runs, then the run index).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--no-plots", is_flag=True, help="Only the summary; write no PNG.")
def report(runs: tuple[str, ...], runs_dir: Path | None, as_json: bool, no_plots: bool) -> None:
    """Plot a run (loss, throughput, step time, GPU; restarts and checkpoints marked) into
    RUN/report/*.png and summarise what it cost: wall time, GPU-hours (sacct where available),
    restarts, steps redone, time lost to restarts and to blocking checkpoint saves.
    Two runs: their curves overlaid, in FIRST/report/vs-SECOND/.

    \b
    Examples:
      hpctrain report demo
      hpctrain report demo --json
      hpctrain report demo demo.old-20261201-101500     # overlay two runs
      hpctrain report lr                                # a sweep: its points as a table
    """
    if len(runs) == 1:
        maybe_forward("report", runs[0], runs_dir)  # a run on a remote site: its report there
        found = sweepdir.find(runs[0], runs_dir)
        if found is not None:
            show(found, as_json)
            return

    result = build(list(runs), runs_dir=runs_dir, with_plots=not no_plots)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
        return

    for s in result.runs:
        click.echo(text(s))
    loss = [p for p in result.plots if Path(p).name == "loss.png"]
    for p in result.plots:
        if p not in loss:
            click.echo(f"  plot: {p}")
    for p in loss:  # last: the one a newcomer looks at first
        click.echo(f"  loss curve: {p}")
