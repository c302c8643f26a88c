"""`hpctrain check-resume`: thin over hpctrain.service.check_resume (moved from cli/resume.py).
No torch here: training and checkpoint comparison run in subprocesses the service starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from hpctrain.kernel import strategies as strategy_names
from hpctrain.service.check_resume import check_resume as check


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

    def say(msg: str) -> None:
        if not as_json:
            click.echo(msg, err=True)

    verdict = check(
        strategy=strategy,
        steps=steps,
        stop_at=stop_at,
        nproc=nproc,
        keep_dir=keep_dir,
        args=args,
        say=say,
    )
    a, b = verdict.uninterrupted_sha256, verdict.resumed_sha256
    if as_json:
        click.echo(json.dumps(verdict.to_json(), indent=2))
    elif verdict.identical:
        click.echo(
            f"bit-identical: interrupted at step {verdict.stopped_at} and resumed, {strategy} x "
            f"{nproc} ranks ends with the same parameters as the uninterrupted run (sha256 "
            f"{a[:16]}...)"
        )
    else:
        diff = verdict.first_difference
        click.echo(f"NOT identical: uninterrupted {a[:16]}... vs resumed {b[:16]}...")
        if diff:
            differs = diff.get("differs")
            what = ", ".join(map(str, differs)) if isinstance(differs, list) else str(differs)
            click.echo(f"  first differing checkpoint: step {diff.get('step')}: {what}")
            click.echo(f"  hint: {diff.get('hint')}")
        click.echo(f"  runs kept in {verdict.folder}")
    if not verdict.identical:
        sys.exit(1)
