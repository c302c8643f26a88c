"""Shell completion (click's): run names for a RUN argument, profile names for --profile.

Enable it once per shell (docs/cli.md): bash `eval "$(_HPCTRAIN_COMPLETE=bash_source hpctrain)"`,
zsh `eval "$(_HPCTRAIN_COMPLETE=zsh_source hpctrain)"`, fish
`_HPCTRAIN_COMPLETE=fish_source hpctrain | source`. Completion never fails a keystroke: a folder
that cannot be read completes nothing.
"""

from __future__ import annotations

from pathlib import Path

import click
from click.shell_completion import CompletionItem

from hpctrain.profiles.discovery import discover
from hpctrain.runs import sweepdir
from hpctrain.runs.folder import all_runs


def _runs_dir(ctx: click.Context) -> Path | None:
    given = ctx.params.get("runs_dir")
    return Path(str(given)) if given else None


def run_names(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """The runs and sweeps `status` would find by name (--runs-dir if given, ./runs, the index)."""
    try:
        where = _runs_dir(ctx)
        names = {r.name for r in all_runs(where)} | {p.name for p in sweepdir.all_sweeps(where)}
    except (OSError, ValueError, RuntimeError):
        return []
    return [CompletionItem(n) for n in sorted(names) if n.startswith(incomplete)]


def profile_names(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Every profile name `profiles list` shows (a YAML path is completed as a file)."""
    if "/" in incomplete or incomplete.startswith("."):
        return [CompletionItem(incomplete, type="file")]
    try:
        names = {e.name for e in discover() if e.error is None and e.name}
    except (OSError, ValueError, RuntimeError):
        return []
    return [CompletionItem(n) for n in sorted(names) if n.startswith(incomplete)]
