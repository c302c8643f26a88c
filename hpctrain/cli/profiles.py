"""`hpctrain profiles list|show|validate|publish`: thin commands over hpctrain.profiles."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpctrain.cli.complete import profile_names
from hpctrain.cli.table import plain_table
from hpctrain.kernel import jobenv
from hpctrain.kernel.errors import Problem, UserError, ValidationError
from hpctrain.profiles.discovery import (
    EXAMPLE,
    _check_shadowing,
    discover,
    profile_name,
    search_dirs,
)
from hpctrain.profiles.load import resolve, resolve_file
from hpctrain.profiles.yamlsafe import read_yaml
from hpctrain.service.profiles import publish as install

if TYPE_CHECKING:
    from rich.console import Console


def _console() -> Console:
    # lazy: CLI start-up: rich for `show` only (`list` is a bench row)
    from rich.console import Console

    if not sys.stdout.isatty():  # a pipe or a file: whole lines, so an origin's file:line greps
        return Console(width=1000)
    return Console(width=max(shutil.get_terminal_size((140, 24)).columns, 100))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def profiles() -> None:
    """List, show, validate, publish and diff site profiles.

    \b
    Examples:
      hpctrain profiles list
      hpctrain profiles show generic-ib --resolved
      hpctrain profiles validate mycluster.yaml
      hpctrain profiles publish mycluster.yaml --to /etc/hpctrain/profiles
    """


@profiles.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
@jobenv.documented
def list_(as_json: bool) -> None:
    """Every profile found, where it comes from, and which file wins a name clash.

    Search order (later wins): bundled, each directory of ${var.SITE_PATH}, then
    $XDG_CONFIG_HOME/hpctrain/profiles. Listed last, from "example": the bundled
    profiles of real clusters (site_configs/examples/), named example:NAME, with
    placeholders (account, paths) to replace in your own copy.

    \b
    Example:
      {var.SITE_PATH}=/etc/hpctrain/profiles hpctrain profiles list --json
    """
    rows = []

    entries = discover()
    for e in sorted(entries, key=lambda e: e.kind == "example"):  # the examples last
        row: dict[str, Any] = {  # Any: JSON values of several types
            "name": e.name,
            "scheduler": None,
            "description": None,
            "path": str(e.path),
            "kind": e.kind,
            "wins": e.wins,
            "shadowed_by": str(e.shadowed_by) if e.shadowed_by else None,
            "error": None,
        }
        if e.error is not None:
            rows.append({**row, "name": e.name or "?", "wins": False, "error": e.error})
            continue
        try:
            if e.wins:
                _check_shadowing(e, [x for x in entries if x.error is None])
            p = resolve_file(e.found or e.path, user_config=False, expect_name=profile_name(e.name))
            row.update(scheduler=p.scheduler, description=p.description)
        except ValidationError as err:
            more = len(err.problems) - 1
            row["error"] = str(err.problems[0]) + (f" (+{more} more)" if more else "")
        except UserError as err:
            row["error"] = err.message.splitlines()[0]
        except Exception as err:  # one broken file must not hide every other profile
            row["error"] = f"cannot load: {type(err).__name__}: {err}"
        rows.append(row)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return

    lines = []
    for r in rows:
        status = (
            "invalid: " + r["error"]
            if r["error"]
            else "wins"
            if r["wins"]
            else f"shadowed by {r['shadowed_by']}"
        )
        lines.append(
            [r["name"], r["scheduler"] or "-", r["description"] or "", r["kind"], status, r["path"]]
        )
    if rows:
        click.echo(
            plain_table(["name", "scheduler", "description", "from", "status", "source"], lines),
            nl=False,
        )
    if any(r["kind"] == "example" for r in rows):
        click.echo(
            f"{EXAMPLE}NAME: a real cluster's public documentation as a profile, with placeholders "
            f"(account, paths); start yours from one: hpctrain profiles show {EXAMPLE}NAME"
        )
    if not rows:
        click.echo("no profiles found in: " + ", ".join(str(d) for d, _ in search_dirs()))


@profiles.command()
@click.argument("name", shell_complete=profile_names)
@click.option(
    "--resolved",
    is_flag=True,
    help="Merge the extends chain, your config and defaults; show each value's origin.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show(name: str, resolved: bool, as_json: bool) -> None:
    """Show profile NAME (a name or a file path): the file as written, or --resolved.

    \b
    Examples:
      hpctrain profiles show roce
      hpctrain profiles show roce --resolved --json
    """
    profile = resolve(name)  # validates the whole chain either way
    if resolved:
        values = profile.model_dump(mode="json")
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "name": profile.name,
                        "source": str(profile.source),
                        "chain": [str(p) for p in profile.chain],
                        "values": values,
                        "origins": profile.origins,
                    },
                    indent=2,
                )
            )
            return
        from rich.table import Table  # lazy: CLI start-up: as _console

        table = Table("key", "value", "origin", title=f"{profile.name} ({profile.source})")
        table.columns[-1].overflow = "fold"
        for key, origin in profile.origins.items():
            value: Any = values  # Any: parsed YAML value of any shape
            for part in key.split("."):
                value = value[part]
            table.add_row(key, json.dumps(value), origin)
        _console().print(table)
        return
    assert profile.source is not None
    if as_json:
        problems: list[Problem] = []
        doc = read_yaml(profile.source, problems)
        click.echo(
            json.dumps(
                {
                    "name": profile.name,
                    "source": str(profile.source),
                    "data": doc.data if doc else None,
                },
                indent=2,
            )
        )
        return
    click.echo(f"# {profile.source}")
    click.echo(profile.source.read_text(encoding="utf-8"), nl=False)


@profiles.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
def validate(files: tuple[Path, ...]) -> None:
    """Check profile FILES (with their extends chains): exit 0 when all are valid, else exit 2
    listing every problem as file:line: key: message; fix.

    \b
    Example:
      hpctrain profiles validate site_configs/*.yaml
    """
    problems: list[Problem] = []
    for f in files:
        try:
            profile = resolve_file(f, user_config=False)
            click.echo(f"{f}: ok")
            for warning in profile.warnings:
                click.echo(f"{f}: warning: {warning}", err=True)
        except ValidationError as e:
            problems += e.problems
        except UserError as e:
            problems.append(Problem(e.message, file=str(f)))
    if problems:
        raise ValidationError(problems)


@profiles.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--to",
    "to",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help=f"Directory to install into (created 0755), e.g. one listed in {jobenv.SITE_PATH}.",
)
@click.option("--force", is_flag=True, help="Replace a different profile of the same name.")
@jobenv.documented
def publish(file: Path, to: Path, force: bool) -> None:
    """Validate FILE, then install it atomically as DIR/NAME.yaml with mode 0644.

    \b
    Example:
      hpctrain profiles publish mycluster.yaml --to /etc/hpctrain/profiles
      export {var.SITE_PATH}=/etc/hpctrain/profiles   # users then see it
    """
    name, target, changed = install(file, to, force=force)
    if not changed:
        click.echo(f"{target}: unchanged")
        return
    click.echo(f"published {name} -> {target}")
    if to.resolve() not in [d.resolve() for d, _ in search_dirs()]:
        click.echo(f"note: {to} is not searched yet; add it to {jobenv.SITE_PATH}")


@profiles.command()
@click.argument("old")
@click.argument("new")
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Nodes of the request both scripts are rendered for.",
)
@click.option(
    "--gpus",
    type=click.IntRange(min=0),
    default=None,
    help="GPUs (workers) per node; default: each profile's own.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def diff(old: str, new: str, nodes: int, gpus: int | None, as_json: bool) -> None:
    """Compare profiles OLD and NEW (names or files): resolved keys, then the rendered scripts.

    Both are rendered for the same request and run folder, so the script diff shows exactly what a
    change to the profile changes on the cluster. Exit 0 when the scripts are the same, 1 if not.

    \b
    Examples:
      hpctrain profiles diff mycluster ./mycluster.yaml        # published vs your draft
      hpctrain profiles diff generic-ib roce --nodes 4 --json
    """
    # lazy: CLI start-up: the renderer (jinja2) only for `diff`; `profiles list` is a bench row
    from hpctrain.service.diff import compare

    result = compare(old, new, nodes=nodes, gpus=gpus)
    click.echo(json.dumps(result.as_json(), indent=2) if as_json else result.text(), nl=as_json)
    if not result.same_script:
        raise SystemExit(1)
