"""`hpctrain doctor`: check the network, ports, GPUs and collectives where the job would run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hpctrain.checks.doctor.report import format_report
from hpctrain.checks.doctor.service import run_local, run_slurm
from hpctrain.checks.preflight.bisect import format_bisection, run_bisect
from hpctrain.cli.complete import profile_names
from hpctrain.kernel.errors import UserError
from hpctrain.profiles import resolve
from hpctrain.remote.doctor import doctor as remote_doctor
from hpctrain.runs.folder import find_run

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile

MIB = 1024**2


@click.command()
@click.option(
    "--profile",
    shell_complete=profile_names,
    help="Site profile (default: the usual default profile; local without Slurm).",
)
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=None,
    help="Nodes to check (Slurm default: 2 if the profile allows it, else 1; local: 1).",
)
@click.option(
    "--gpus",
    type=click.IntRange(min=1),
    default=None,
    help="Workers per node (default: the profile's GPUs per node; local: 2).",
)
@click.option(
    "--quick", is_flag=True, help="Cap the all-reduce sweep at 16 MiB instead of 256 MiB."
)
@click.option(
    "--max-mib",
    type=click.IntRange(min=1),
    default=None,
    help="Largest all-reduce in MiB (overrides --quick).",
)
@click.option(
    "--timeout-s",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    help="Process-group timeout of the sweep.",
)
@click.option(
    "--wait-s",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Slurm: how long to wait for the job before cancelling it.",
)
@click.option(
    "--bisect",
    "bisect",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[RUN]",
    help="Find the failing or slow node by halving: among RUN's nodes, or (--bisect --nodes N) "
    "among N nodes Slurm gives; prints the list for `submit --exclude` (docs/bad-nodes.md).",
)
@click.option(
    "--runs-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="--bisect RUN: where runs are.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def doctor(
    profile: str | None,
    nodes: int | None,
    gpus: int | None,
    quick: bool,
    max_mib: int | None,
    timeout_s: float,
    wait_s: float,
    bisect: str | None,
    runs_dir: str | None,
    as_json: bool,
) -> None:
    """Check the profile's interface, name resolution, rendezvous port, InfiniBand, GPUs, scontrol
    and /dev/shm on every node, then sweep all-reduce from 1 KiB to 256 MiB over the real backend.

    Local profile: runs on this machine. Slurm profile: submits a short job through the same
    rendered script as `submit` (entry `python -m hpctrain.checks.doctor.worker`) and reports per node.
    Each failure names its likely cause and the fix. Exit 0 when every check passes, 1 otherwise.

    \b
    Examples:
      hpctrain doctor --quick
      hpctrain doctor --profile mycluster --nodes 2 --json
      hpctrain doctor --profile mycluster --bisect gpt-small     # which node of that run is bad
      hpctrain doctor --profile mycluster --bisect --nodes 8
      hpctrain doctor --profile mysite-remote --quick   # over SSH (docs/remote.md)
    """
    prof = resolve(profile)
    if bisect is not None:
        _bisect(prof, bisect, nodes=nodes, gpus=gpus, runs_dir=runs_dir, as_json=as_json)
        return
    if (
        getattr(prof, "login", None) is not None
    ):  # a remote site: check the way there, then its doctor
        rest = [
            *(["--nodes", str(nodes)] if nodes else []),
            *(["--gpus", str(gpus)] if gpus else []),
            *(["--quick"] if quick else []),
            *(["--max-mib", str(max_mib)] if max_mib else []),
            "--timeout-s",
            str(timeout_s),
            "--wait-s",
            str(wait_s),
            *(["--json"] if as_json else []),
        ]
        raise SystemExit(remote_doctor(prof, rest, click.echo))
    max_bytes = (max_mib * MIB) if max_mib else (16 * MIB if quick else 256 * MIB)
    if prof.scheduler == "slurm":
        if nodes is None:
            nodes = 2 if (prof.slurm.max_nodes or 2) >= 2 else 1
        if not as_json:
            click.echo(
                f"submitting a doctor job on {nodes} node(s) with profile {prof.name}...", err=True
            )
        rep = run_slurm(
            prof,
            nodes=nodes,
            gpus=gpus,
            max_bytes=max_bytes,
            timeout_s=timeout_s,
            wait_s=wait_s,
            progress=None if as_json else lambda s: click.echo(f"  {s}", err=True),
        )
    else:
        rep = run_local(
            prof, nodes=nodes or 1, gpus=gpus or 2, max_bytes=max_bytes, timeout_s=timeout_s
        )
    click.echo(rep.to_json() if as_json else format_report(rep))
    if not rep.ok:
        raise SystemExit(1)


def _bisect(
    prof: ResolvedProfile,
    run: str,
    *,
    nodes: int | None,
    gpus: int | None,
    runs_dir: str | None,
    as_json: bool,
) -> None:
    if prof.scheduler != "slurm":
        raise UserError(
            f"--bisect needs a Slurm profile (profile {prof.name} is local: one machine)"
        )
    run_dir = find_run(run, Path(runs_dir) if runs_dir else None).path if run else None
    result = run_bisect(
        prof,
        run_dir=run_dir,
        nodes=nodes,
        gpus=gpus,
        progress=None if as_json else lambda s: click.echo(f"  {s}", err=True),
    )
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else format_bisection(result))
    if result.bad:
        raise SystemExit(1)
