"""`submit --wait`: follow the job to its end, then say how it ended. Its own module: the
follower and the failure reader are loaded only when a command waits (`submit --dry-run` is a
bench row, hpctrain/cli/jobs.py)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from hpctrain.kernel import states
from hpctrain.runs.cause import root_cause
from hpctrain.runs.progress import Follower, describe, snapshot
from hpctrain.service.submit import wait

if TYPE_CHECKING:
    from hpctrain.runs.folder import RunDir
    from hpctrain.service.submit import Submitted


def _stderr(text: str) -> None:
    click.echo(text, err=True)


def wait_for(run: RunDir, name: str, *, total: int | None, record: Submitted | None = None) -> None:
    """Follow the job to its end: state and training progress; on failure, why and where.
    `record` (submit --json): print it with the final state, progress and cause as one object."""
    follow = Follower(run, total=total, out=_stderr)
    try:
        final = wait(run, on_poll=follow)
    except KeyboardInterrupt:
        follow.close()
        click.echo(
            f"\nstopped waiting; {name} keeps running (`hpctrain cancel {name}` stops it)", err=True
        )
        sys.exit(130)
    follow.close()
    snap = snapshot(run, total)
    cause = root_cause(run.path) if final != states.COMPLETED else None
    if record is not None:
        progress = snap.to_json() if snap else None
        why = cause.to_json() if cause else None
        click.echo(
            json.dumps(
                record.to_json() | {"state": final, "progress": progress, "why": why}, indent=2
            )
        )
    else:
        click.echo(f"{name}: {final}  {describe(snap)}")
    if final != states.COMPLETED:
        if cause:
            click.echo(f"  why: {cause.line}\n  full log: {cause.log}", err=True)
        else:
            click.echo(
                f"  no error line found; logs: {run.logs} (`hpctrain logs {name}`)", err=True
            )
        sys.exit(1)
