"""Commands on a remote run: this machine's index says where the run lives; the same command runs
there, on the site's hpctrain, with the run folder's path in place of its name."""

from __future__ import annotations

import sys
from pathlib import Path

from hpctrain.kernel.errors import UserError
from hpctrain.remote import index
from hpctrain.remote.site import Site
from hpctrain.remote.ssh import Login, RemoteError
from hpctrain.runs import sweepdir
from hpctrain.runs.folder import find_run


def is_local(ref: str, runs_dir: Path | None) -> bool:
    if sweepdir.find(ref, runs_dir) is not None:
        return True

    try:
        find_run(ref, runs_dir)
    except UserError:
        return False
    return True


def site_args(command: str, ref: str, path: str, argv: list[str]) -> list[str]:
    """This command line for the site: the run's remote path for REF, no --runs-dir."""
    try:
        rest = argv[argv.index(command) + 1 :]
    except ValueError:
        rest = []
    out: list[str] = []
    skip = False
    replaced = False
    for i, arg in enumerate(rest):
        if skip:
            skip = False
            continue
        if arg == "--":
            out += rest[i:]
            break
        if arg == "--runs-dir":
            skip = True
            continue
        if arg.startswith("--runs-dir="):
            continue
        if arg == ref and not replaced:
            out.append(path)
            replaced = True
            continue
        out.append(arg)
    if not replaced:
        out.insert(0, path)
    return [command, *out]


def maybe_forward(command: str, ref: str | None, runs_dir: Path | None = None) -> None:
    """Run `command` on the site when REF is a remote run (and not a run here); exits with the
    site's exit code. Returns when the command is for this machine."""
    if ref is None or is_local(ref, runs_dir):
        return
    found = index.find(ref)
    if found is None:
        return
    entry, path = found
    site = Site(Login.of(entry["login"]))
    sys.stdout.flush()
    raise SystemExit(site.hpctrain(site_args(command, ref, path, sys.argv)))


def each_site(args: list[str]) -> list[tuple[str, int]]:
    """`hpctrain ARGS` on every site this machine has submitted to: [(host, exit code)]. A site
    that cannot be reached is named on stderr and skipped (exit code 255)."""
    out = []
    for login in index.sites():
        site = Site(Login.of(login))
        print(f"== {site.login.where} ==", flush=True)
        try:
            out.append((site.login.where, site.hpctrain(args)))
        except RemoteError as e:
            print(f"warning: {e.message}", file=sys.stderr, flush=True)
            out.append((site.login.where, 255))
    return out


def each_json(args: list[str]) -> list[dict[str, object]]:
    """`hpctrain ARGS` (a --json listing) on every known site, each item marked with its site; an
    unreachable site gives one item {"site", "error"}."""
    out: list[dict[str, object]] = []
    for login in index.sites():
        site = Site(Login.of(login))
        try:
            items = site.hpctrain_json(args)
            if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
                raise RemoteError(f"{site.login.where}: hpctrain {args[0]} listed no objects")
        except RemoteError as e:
            out.append({"site": site.login.where, "error": e.message})
            continue
        out += [{**item, "site": site.login.where} for item in items if isinstance(item, dict)]
    return out
