"""status, runs, logs, cancel: thin commands over hpctrain.service (status, logs). They parse and
print; reading and cancelling happen in the service layer."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import click

from hpctrain.cli.complete import run_names
from hpctrain.cli.table import plain_table, printable
from hpctrain.kernel.errors import UserError
from hpctrain.remote.index import sites
from hpctrain.runs import in_job, spares, sweepdir
from hpctrain.runs.folder import all_runs, find_run
from hpctrain.runs.phase import Phase
from hpctrain.runs.progress import describe, health_lines
from hpctrain.service import points
from hpctrain.service import status as status_service
from hpctrain.service.logs import follow as follow_logs
from hpctrain.service.logs import log_files, shown
from hpctrain.service.status import BROKEN, Detail, Summary, SweepCancelled


def _remote() -> ModuleType:
    """hpctrain.remote.forward, on first use: it loads pydantic (a site's login), 0.1-0.2 s that
    a listing without remote sites, or a run here, never needs."""
    from hpctrain.remote import forward  # lazy: CLI start-up: pydantic for remote runs only

    return forward


_runs_dir_option = click.option(
    "--runs-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to look for runs by name (default ./runs, then the run index).",
)


@click.command()
@click.argument("run", required=False, shell_complete=run_names)
@_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def status(run: str | None, runs_dir: Path | None, as_json: bool) -> None:
    """Show a run's state, job id, nodes, restarts and newest checkpoint step (or every run's).

    \b
    Example:
      hpctrain status demo
      hpctrain status demo --json
    """
    if run is not None:
        _remote().maybe_forward("status", run, runs_dir)

    found = sweepdir.find(run, runs_dir) if run else None
    if found is not None:
        show(found, as_json)
        return

    if run is None:
        items = status_service.summaries(all_runs(runs_dir))
        if as_json:
            click.echo(json.dumps([i.to_json() for i in items], indent=2))
        else:
            _table(items)
        return

    try:
        info = status_service.detail(find_run(run, runs_dir))
    except UserError as e:  # a broken run's reason quotes its files
        raise UserError(printable(e.message)) from None
    if as_json:  # json escapes every control character itself
        click.echo(json.dumps(info.to_json(), indent=2))
        return
    _echo(_detail_lines(info))


def _echo(lines: list[str]) -> None:
    """Each line printed as one line: run-folder text keeps no control character (ESC, BEL, a
    newline of its own)."""
    if lines:
        click.echo("\n".join(printable(line) for line in lines))


def _detail_lines(info: Detail) -> list[str]:
    step = info.checkpoint_step
    job = f"  (job {info.job_id}, {info.scheduler}, profile {info.profile})"
    # a failed run says why in its first line
    head = f"{info.name}: {info.state}" + (f": {info.reason}" if info.reason else "")
    if info.phase:  # the run folder knows sooner than the scheduler (preempted, requeued)
        differs = info.state != info.scheduler_state
        head += f" ({info.phase}" + (
            f"; the scheduler says {info.scheduler_state})" if differs else ")"
        )
    out = [head, job] if info.reason else [head + job]
    training = not Phase(info.state, info.phase).stale  # else its newest line is from before
    out += [
        f"  topology: {info.nodes} node(s) x {info.gpus_per_node}, strategy {info.strategy}"
        f"{', mesh ' + info.mesh if info.mesh else ''}",
        f"  restarts: {info.restarts} ({info.starts} start(s) of the script, "
        f"{len(info.jobs)} submission(s))",
        in_job.line(info.in_job_restarts),
        f"  training: {describe(info.progress, training=training)}",
        f"  newest checkpoint: {'step ' + str(step) if step is not None else 'none yet'}",
        f"  folder: {info.path}",
    ]
    if info.chain:
        out.append(
            f"  chain: {len(info.chain)} jobs, one after another: "
            + " -> ".join(f"{x['job_id']} {x['state']}" for x in info.chain)
        )
    if info.root_cause:
        out.append(f"  why it failed: {info.root_cause.line}")
        out.append(f"  full log: {info.root_cause.log}")
    out += health_lines(info.health) + spares.lines(info.spares)
    out += [
        f"    start {start.get('time')} job {start.get('job_id')} restart "
        f"{start.get('restart_count')} on {start.get('host')}"
        for start in info.history
    ]
    return out


@click.command()
@_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def runs(runs_dir: Path | None, as_json: bool) -> None:
    """List runs (./runs and every run created from this account) in a table.

    \b
    Example:
      hpctrain runs
      hpctrain runs --json
    """
    items = status_service.summaries(all_runs(runs_dir))
    remote = sites()
    if as_json:
        rows = [i.to_json() for i in items] + (
            _remote().each_json(["runs", "--json"]) if remote else []
        )
        click.echo(json.dumps(rows, indent=2))
        return
    _table(items)

    for found in sweepdir.all_sweeps(runs_dir):
        click.echo("")
        show(found, False)
    if remote:
        _remote().each_site(["runs"])


COLUMNS = ("name", "state", "job", "nodes x gpus", "strategy", "restarts", "ckpt step", "created")
# above this many rows the plain table: rich measures every cell (10,000 rows: 8.5 s of CPU
# against 0.04 s); a listing this long is read with a pager or grep, not for its frame
RICH_ROWS = 200


def _table(items: Sequence[Summary]) -> None:
    rows = [
        [
            i.name,
            i.state,
            str(i.job_id),
            f"{i.nodes} x {i.gpus_per_node}",
            str(i.strategy),
            str(i.restarts),
            "-" if i.checkpoint_step is None else str(i.checkpoint_step),
            str(i.created),
        ]
        for i in items
    ]
    if len(rows) > RICH_ROWS:
        click.echo(plain_table(COLUMNS, rows), nl=False)
    else:
        _rich_table(rows)
    _echo([f"{i.name}: broken: {i.reason}" for i in items if i.state == BROKEN])


def _rich_table(rows: Sequence[Sequence[str]]) -> None:
    from rich import console, table  # lazy: CLI start-up: rich for the table only

    shown = table.Table()
    for column in COLUMNS:
        shown.add_column(column)
    for row in rows:
        shown.add_row(*(printable(c) for c in row))
    out = console.Console(markup=False)  # a run's name or reason is never rich markup
    if not out.is_terminal:
        out = console.Console(width=200, markup=False)  # piped: no truncation
    out.print(shown)


@click.command()
@click.argument("run", shell_complete=run_names)
@click.option(
    "--rank",
    "-r",
    type=int,
    help="One rank's output: logs/rank-R.log (train_entry), or torchrun's "
    "per-rank files under logs/torchrun/ (your own --script/--module).",
)
@click.option(
    "--node", type=int, help="Show logs/node-N.log (one per node: torchrun and the workers)."
)
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Keep printing new lines until the job ends (Ctrl-C stops).",
)
@_runs_dir_option
def logs(run: str, rank: int | None, node: int | None, follow: bool, runs_dir: Path | None) -> None:
    """Show a run's logs: the batch script's log, or one node's or one rank's.

    \b
    Examples:
      hpctrain logs demo            # logs/batch.log, then every node log
      hpctrain logs demo --rank 1
      hpctrain logs demo --node 0 --follow
    """
    _remote().maybe_forward("logs", run, runs_dir)

    if sweepdir.find(run, runs_dir) is not None:
        raise UserError(
            f"{run} is a sweep: give one point, e.g. `hpctrain logs {run}/0` "
            f"(`hpctrain status {run}` lists them)"
        )

    r = find_run(run, runs_dir)
    files = log_files(r, rank=rank, node=node, follow=follow)
    if not follow:
        for f in files:
            if f.is_file():
                if len(files) > 1:
                    click.echo(f"==> {f} <==")
                click.echo(shown(f), nl=False)  # a routine preempt's launcher noise left out
        return
    follow_logs(
        r, files, lambda text: click.echo(text, nl=False), new_nodes=rank is None and node is None
    )


@click.command()
@click.argument("run", shell_complete=run_names)
@_runs_dir_option
def cancel(run: str, runs_dir: Path | None) -> None:
    """Cancel a run's current job (Slurm: scancel; local: TERM, then KILL after 60 s).
    The run folder and its checkpoints stay; `hpctrain resume RUN` continues it.

    \b
    Example:
      hpctrain cancel demo
    """
    _remote().maybe_forward("cancel", run, runs_dir)
    res = status_service.cancel(run, runs_dir)
    if isinstance(res, SweepCancelled):
        for point, state in res.points:
            click.echo(f"{res.sweep}/{point}: cancel sent (now {state})")
        click.echo(
            f"sweep {res.sweep}: {len(res.points)} point(s) cancelled; resume with "
            f"`hpctrain resume {res.sweep}`"
        )
        return
    name = res.name
    if res.after is None:
        click.echo(f"{name} is not running ({res.before}); nothing to cancel")
        return
    click.echo(
        f"{name}: cancel sent (was {res.before}, now {res.after}); resume with `hpctrain resume {name}`"
    )


def show(sweep_dir: Path, as_json: bool) -> None:
    """`status SWEEP` / `runs` / `report SWEEP`: the sweep as a table of its points."""
    rows = points.table(sweep_dir)
    if as_json:
        listed = [dataclasses.asdict(r) for r in rows]
        click.echo(
            json.dumps(
                {"sweep": sweep_dir.name, "path": str(sweep_dir), "points": listed}, indent=2
            )
        )
        return
    _echo([f"sweep {sweep_dir.name} ({sweep_dir})"])
    body = [
        [
            str(r.index),
            r.point,
            r.state,
            str(r.job_id or "-"),
            "-" if r.checkpoint_step is None else str(r.checkpoint_step),
            "-" if r.final_loss is None else f"{r.final_loss:.4f}",
        ]
        for r in rows
    ]
    click.echo(
        plain_table(["index", "point", "state", "job", "ckpt step", "final loss"], body), nl=False
    )
