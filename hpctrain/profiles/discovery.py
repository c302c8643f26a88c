"""Discovery: which profile file a name means (bundled < each site path folder, jobenv SITE_PATH <
the user's own), and the refusal of a user profile that would silently drop a site's locks.

The bundled real-cluster examples (site_configs/examples/) are found too, under their own names
`example:STEM`: shown by `profiles list`, usable as `--profile example:STEM` or
`extends: example:STEM`, never clashing with (or shadowing) a profile of the plain name."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from hpctrain.kernel import jobenv, resources
from hpctrain.kernel.errors import Problem, UserError
from hpctrain.kernel.values import mutable
from hpctrain.profiles import trust as _trust
from hpctrain.profiles.yamlsafe import read_yaml


def check_trust(path: Path, *, bundled: bool = False) -> Path:
    """Refuse a profile that anyone but its owner (or root) could have changed (trust.py); returns
    the resolved path."""
    return _trust.check_trust(path, what=f"profile {path}", bundled=bundled)


@mutable
class Entry:
    """One profile file found by discovery."""

    name: str
    path: Path
    kind: str  # "bundled" | "example" | "site" | "user"
    shadowed_by: Path | None = None  # the file that wins this name, when not this one
    found: Path | None = None  # the path as found (the trust check follows it, symlinks too)
    error: str | None = None  # a search folder that cannot be read: one broken row

    @property
    def wins(self) -> bool:
        return self.shadowed_by is None


def config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "hpctrain"


EXAMPLE = "example:"  # the name prefix of a bundled example: example:juwels-booster


def profile_name(ref: str) -> str:
    """The `name:` a profile found as REF carries: an example's name without its prefix."""
    return ref.removeprefix(EXAMPLE)


def search_dirs(*, examples: bool = True) -> list[tuple[Path, str]]:
    """Discovery order, lowest precedence first."""
    dirs: list[tuple[Path, str]] = []
    try:
        bundled = resources.bundled("site_configs")
        dirs.append((bundled, "bundled"))
        if examples:
            dirs.append((bundled / "examples", "example"))
    except FileNotFoundError:
        pass
    for d in (jobenv.get(jobenv.SITE_PATH) or "").split(":"):
        if d:
            dirs.append((Path(d).expanduser(), "site"))
    dirs.append((config_home() / "profiles", "user"))
    return dirs


def discover(*, examples: bool = True) -> list[Entry]:
    """Every profile file, in precedence order (lowest first); later wins a name clash.
    `examples`: with the bundled examples (named `example:STEM`)."""
    entries: list[Entry] = []
    broken: list[Entry] = []
    for d, kind in search_dirs(examples=examples):
        try:
            if not d.is_dir():
                continue
            files = sorted(
                p
                for p in d.iterdir()
                if p.suffix in (".yaml", ".yml") and not p.name.startswith(".") and p.is_file()
            )
            prefix = EXAMPLE if kind == "example" else ""
            found = [
                Entry(prefix + p.stem, p.resolve(), kind, found=Path(os.path.abspath(p)))
                for p in files
            ]
        except (OSError, RuntimeError) as err:
            reason = getattr(err, "strerror", None) or str(err)
            broken.append(
                Entry(
                    "",
                    d,
                    kind,
                    found=d,
                    error=f"cannot read search folder {d}: {reason}; "
                    f"fix: make it readable or remove it from {jobenv.SITE_PATH}",
                )
            )
            continue
        stems = [e.name for e in found]
        for e in found:  # NAME.yaml beside NAME.yml: an error, never a silent winner
            if stems.count(e.name) > 1:
                e.error = (
                    f"{e.found}:1: name: both {e.name}.yaml and {e.name}.yml are in {d}; "
                    "fix: delete one of them (hpctrain does not pick one)"
                )
        entries += found
    winners = {e.name: e.path for e in entries if e.error is None}
    for e in entries:
        if e.name in winners and winners[e.name] != e.path:
            e.shadowed_by = winners[e.name]
    return entries + broken


def _is_bundled(path: Path) -> bool:
    """A file shipped with hpctrain: a bundled profile or one of the bundled examples."""
    try:
        home = resources.bundled("site_configs").resolve()
    except FileNotFoundError:
        return False
    return path.resolve().parent in (home, home / "examples")


def _looks_like_path(ref: str) -> bool:
    return "/" in ref or ref.endswith((".yaml", ".yml"))


def find(name: str, *, skip: set[Path] | None = None) -> Path:
    """The winning file for a profile name (skipping files already in an extends chain)."""
    every = discover()
    for e in every:
        if e.error is not None and e.name == name:
            raise UserError(e.error)
    entries = [e for e in every if e.error is None]
    for e in reversed(entries):
        if e.name == name and e.path not in (skip or set()):
            _check_shadowing(e, entries)
            return e.found or e.path
    every_name = sorted({e.name for e in entries})
    close = difflib.get_close_matches(name, every_name, n=1)
    if not close and not name.startswith(EXAMPLE):  # `alvis` for `example:c3se-alvis`
        close = [n for n in every_name if n.startswith(EXAMPLE) and name in n][:1]
    hint = f"did you mean {close[0]!r}? " if close else ""
    names = [n for n in every_name if not n.startswith(EXAMPLE)]
    more = len(every_name) - len(names)
    also = f" (and {more} bundled examples, {EXAMPLE}NAME)" if more else ""
    raise UserError(
        f"no profile named {name!r}; {hint}available: {', '.join(names) or 'none'}{also}.\n"
        "  fix: pass --profile with one of these names or a path to a profile file "
        "(`hpctrain profiles list` shows where each comes from)"
    )


def _users(e: Entry) -> bool:
    """The user's own file: in their config folder, or in a site path folder that they own (anyone
    can put a folder of theirs on the site path; it must not outrank an admin's locks)."""
    if e.kind == "user":
        return True
    uid = os.getuid()
    if e.kind != "site" or uid == 0:
        return False
    for p in {e.found or e.path, e.path}:
        for q in (p, p.parent):
            try:
                if q.lstat().st_uid == uid:
                    return True
            except OSError:
                continue
    return False


def _check_shadowing(winner: Entry, entries: list[Entry]) -> None:
    """A user's profile may not silently replace a site (or bundled) profile that locks keys: the
    admin's locks would be gone without a word. Refused, with the way to build on it instead."""
    if not _users(winner):
        return
    mine = read_yaml(winner.path, [])
    if mine is not None and mine.data.get("extends") == winner.name:
        return  # builds on the site's profile of the same name: its locks still hold
    for e in entries:
        if e.name != winner.name or _users(e) or e.path == winner.path:
            continue
        problems: list[Problem] = []
        doc = read_yaml(e.path, problems)
        locked = doc.data.get("locked") if doc else None
        if locked:
            raise UserError(
                f"your profile {winner.found or winner.path} has the same name as the {e.kind} "
                f"profile {e.path}, which locks {locked}: yours would silently drop those locks. "
                f"Refusing it.\n  fix: rename yours (e.g. {winner.name}-mine.yaml with "
                f"`name: {winner.name}-mine`) and "
                f"add `extends: {winner.name}` to build on the site's profile"
            )
