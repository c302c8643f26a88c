"""`hpctrain doctor`: check the network, ports, GPUs and collectives where the job would run."""

from __future__ import annotations

import click

MIB = 1024**2


@click.command()
@click.option("--profile", help="Site profile (default: the usual default profile; local without Slurm).")
@click.option("--nodes", type=click.IntRange(min=1), default=None,
              help="Nodes to check (Slurm default: 2 if the profile allows it, else 1; local: 1).")
@click.option("--gpus", type=click.IntRange(min=1), default=None,
              help="Workers per node (default: the profile's GPUs per node; local: 2).")
@click.option("--quick", is_flag=True, help="Cap the all-reduce sweep at 16 MiB instead of 256 MiB.")
@click.option("--max-mib", type=click.IntRange(min=1), default=None,
              help="Largest all-reduce in MiB (overrides --quick).")
@click.option("--timeout-s", type=click.FloatRange(min=1), default=120.0, show_default=True,
              help="Process-group timeout of the sweep.")
@click.option("--wait-s", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Slurm: how long to wait for the job before cancelling it.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def doctor(profile, nodes, gpus, quick, max_mib, timeout_s, wait_s, as_json) -> None:
    """Check the profile's interface, name resolution, rendezvous port, InfiniBand, GPUs, scontrol
    and /dev/shm on every node, then sweep all-reduce from 1 KiB to 256 MiB over the real backend.

    Local profile: runs on this machine. Slurm profile: submits a short job through the same
    rendered script as `submit` (entry `python -m hpctrain.doctor_worker`) and reports per node.
    Each failure names its likely cause and the fix. Exit 0 when every check passes, 1 otherwise.

    \b
    Examples:
      hpctrain doctor --quick
      hpctrain doctor --profile mycluster --nodes 2 --json
    """
    from hpctrain.doctor import format_report, run_local, run_slurm
    from hpctrain.profiles import resolve

    prof = resolve(profile)
    max_bytes = (max_mib * MIB) if max_mib else (16 * MIB if quick else 256 * MIB)
    if prof.scheduler == "slurm":
        if nodes is None:
            nodes = 2 if (prof.slurm.max_nodes or 2) >= 2 else 1
        if not as_json:
            click.echo(f"submitting a doctor job on {nodes} node(s) with profile {prof.name}...", err=True)
        rep = run_slurm(prof, nodes=nodes, gpus=gpus, max_bytes=max_bytes, timeout_s=timeout_s,
                        wait_s=wait_s, progress=None if as_json else lambda s: click.echo(f"  {s}", err=True))
    else:
        rep = run_local(prof, nodes=nodes or 1, gpus=gpus or 2, max_bytes=max_bytes, timeout_s=timeout_s)
    click.echo(rep.to_json() if as_json else format_report(rep))
    if not rep.ok:
        raise SystemExit(1)
