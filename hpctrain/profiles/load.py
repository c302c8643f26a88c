"""Resolving a profile: the `extends` chain, layers, locked keys (safe YAML: yamlsafe.py; which
file a name means: discovery.py; trust: trust.py; what a lock covers: locks.py; pydantic's errors
as located problems: problems.py).

Layers, lowest first: the schema's defaults < the `extends` chain (root ancestor first) < the
user's config (`overrides:` in $XDG_CONFIG_HOME/hpctrain/config.yaml) < command-line flags.
Mappings merge key by key; lists and scalars replace; null resets a key to its default.
`locked` keys accumulate down the chain: a child profile, the user config and flags may not
change them (setting the same value is allowed).
"""

from __future__ import annotations

import difflib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.kernel.errors import Problem, UserError, ValidationError
from hpctrain.kernel.yamlsafe import (  # noqa: F401  (re-exported: the loader's public names)
    MAX_BYTES,
    MAX_DEPTH,
    MAX_INT,
    Doc,
    Path_,
    _bad_text,
    dotted,
    yaml_scalar,
)
from hpctrain.profiles import cache, schema
from hpctrain.profiles import locks as _locks
from hpctrain.profiles.discovery import (  # noqa: F401  (re-exported: the loader's public names)
    Entry,
    _is_bundled,
    _looks_like_path,
    check_trust,
    config_home,
    discover,
    find,
    search_dirs,
)
from hpctrain.profiles.layers import (  # noqa: F401
    _MISSING,
    _bad_flag_value,
    _covers,
    _drop_nulls,
    _flags_layer,
    _get,
    _Layer,
    _leaves,
    _merge,
    _user_config,
)
from hpctrain.profiles.problems import (
    NAME_MISSING,
    _dedupe,
    _more_cross_field,
    _problems,
    _quoted_wants,
)
from hpctrain.profiles.yamlsafe import read_yaml

if TYPE_CHECKING:
    from hpctrain.profiles.cache import ProfileView
    from hpctrain.profiles.resolved import ResolvedProfile
    from hpctrain.profiles.schema.profile import Profile
# pydantic and the schema's models load on first use through the schema's face (schema.Profile,
# schema.ValidationError): a cached validation (profiles/cache.py) needs neither, which halves the
# CLI's start-up.


def _chain(top: Path, problems: list[Problem]) -> list[Doc]:
    """The top file and its ancestors (top first). Cycles and missing parents are problems."""
    docs: list[Doc] = []
    seen: list[Path] = []
    literal: Path | None = top
    while literal is not None:
        path = _trust_or_resolve(literal)
        if path in seen:
            names = " -> ".join(str(p) for p in [*seen, path])
            problems.append(
                Problem(
                    f"extends forms a cycle: {names}; fix: break the cycle",
                    file=str(docs[-1].path),
                    line=docs[-1].lines.get(("extends",)),
                    key="extends",
                )
            )
            break
        seen.append(path)
        check_trust(literal, bundled=_is_bundled(path))
        doc = read_yaml(path, problems)
        if doc is None:
            break
        docs.append(doc)
        if "name" not in doc.data:
            problems.append(Problem(NAME_MISSING, file=str(path), key="name"))
        parent = doc.data.get("extends")
        if parent is None:
            break
        if not isinstance(parent, str) or not parent:
            break  # the schema reports the wrong type
        if _looks_like_path(parent):
            p = Path(parent).expanduser()
            literal = Path(os.path.abspath(path.parent / p))
            if not literal.is_file():
                problems.append(
                    Problem(
                        f"extends {parent!r}: no such file ({literal}); fix: give a "
                        "path relative to this file, or a profile name",
                        file=str(doc.path),
                        line=doc.lines.get(("extends",)),
                        key="extends",
                    )
                )
                break
        else:
            try:
                literal = find(parent, skip=set(seen))
            except UserError:
                others = [e.path for e in discover() if e.name == parent]
                if others and all(p in seen for p in others):
                    cycle = " -> ".join(str(p) for p in [*seen, others[-1]])
                    msg = f"extends forms a cycle: {cycle}; fix: break the cycle"
                else:
                    known = sorted({e.name for e in discover()})
                    close = difflib.get_close_matches(parent, known, n=1)
                    hint = f"did you mean {close[0]!r}? " if close else ""
                    msg = (
                        f"extends {parent!r}: no such profile; {hint}fix: use one of "
                        f"{', '.join(known)} or a path"
                    )
                problems.append(
                    Problem(
                        msg, file=str(doc.path), line=doc.lines.get(("extends",)), key="extends"
                    )
                )
                break
    return docs


def _trust_or_resolve(path: Path) -> Path:
    try:
        return path.resolve(strict=True)
    except (OSError, RuntimeError):
        check_trust(path)  # raises with the reason (missing, a symlink loop, ...)
        raise


def _locks_of(doc: Doc, problems: list[Problem]) -> list[str]:
    """The file's `locked:` list. Anything else is an error: a lock that is silently dropped is a
    lock that is gone."""
    if "locked" not in doc.data or doc.data["locked"] is None:
        return []
    locked, file = doc.data["locked"], str(doc.path)
    example = "fix: write a list of dotted keys, e.g. `locked: [slurm.account, network]`"
    if not isinstance(locked, list):
        kind = type(locked).__name__.replace("str", "text").replace("dict", "mapping")
        problems.append(
            Problem(
                f"locked is {kind} ({str(locked)[:60]!r}), not a list; {example}",
                file=file,
                line=doc.lines.get(("locked",)),
                key="locked",
            )
        )
        return []
    out = []
    keys = [k for k in locked if isinstance(k, str)]
    unknown = set(cache.memo("unknown_lock_keys", {"keys": keys}, _unknown_keys)) if keys else set()
    for i, key in enumerate(locked):
        line = doc.lines.get(("locked", i), doc.lines.get(("locked",)))
        if not isinstance(key, str):
            problems.append(
                Problem(
                    f"{key!r} is not a dotted key; {example}",
                    file=file,
                    line=line,
                    key=f"locked[{i}]",
                )
            )
        elif key.split(".")[0] in ("name", "extends", "locked"):
            problems.append(
                Problem(
                    f"{key!r} cannot be locked; fix: remove it from locked",
                    file=file,
                    line=line,
                    key=f"locked[{i}]",
                )
            )
        elif key in unknown:
            problems.append(
                Problem(
                    f"locked key {key!r} is not a profile key; fix: use dotted keys "
                    "such as 'slurm.account' or a section such as 'network'",
                    file=file,
                    line=line,
                    key=f"locked[{i}]",
                )
            )
        else:
            out.append(key)
    return out


def _unknown_keys(data: dict[str, Any]) -> list[str]:
    return [k for k in data["keys"] if not schema.key_exists(k)]


def resolve_file(
    top: Path,
    flags: dict[str, object] | None = None,
    *,
    user_config: bool = True,
    expect_name: str | None = None,
) -> ResolvedProfile:
    """Resolve the profile in file `top` through every layer; all problems raised together."""
    problems: list[Problem] = []
    docs = _chain(top, problems)
    layers = [
        _Layer(d.data, d.lines, str(d.path), str(d.path), _locks_of(d, problems))
        for d in reversed(docs)
    ]
    if docs and expect_name is not None and docs[0].data.get("name") not in (None, expect_name):
        problems.append(
            Problem(
                f"name {docs[0].data['name']!r} does not match the file name "
                f"{expect_name!r}; fix: rename the file to "
                f"{docs[0].data['name']}.yaml or change name",
                file=str(docs[0].path),
                line=docs[0].lines.get(("name",)),
                key="name",
            )
        )
    if user_config:
        _, layer = _user_config(problems)
        if layer is not None:
            layers.append(layer)
    if flags:
        layers.append(_flags_layer(flags, problems))

    merged: dict[str, Any] = {}
    origins: dict[Path_, str] = {}
    where: dict[Path_, tuple[str | None, int | None]] = {}
    locks: dict[str, str] = {}  # dotted key -> the profile file that locked it
    quoted: list[
        tuple[Path_, str, _Layer]
    ] = []  # text values where the schema may want bools/numbers
    for layer in layers:
        for path, value in _leaves(layer.data):
            if not path or path == ("locked",):
                continue
            key = dotted(path)
            if (
                layer.origin != "flag"
                and isinstance(value, str)
                and all(isinstance(p, str) for p in path)
            ):
                quoted.append((path, value, layer))
            locked = _locks.covering_lock(locks, path)
            if locked is not None and _get(merged, path) != value:
                by = locks[locked]
                also = "" if _covers(key, locked) else f" ({key} sets what {locked} covers)"
                problems.append(
                    Problem(
                        f"{locked} is locked by profile {by}{also}; fix: remove {key} here (ask the "
                        "profile's admin if it must change)",
                        file=layer.file,
                        line=layer.lines.get(path),
                        key=key,
                    )
                )
        merged = _merge(merged, {k: v for k, v in layer.data.items() if k != "locked"})
        for path, _ in _leaves(layer.data):
            if not path:
                continue
            for old in [p for p in origins if p[: len(path)] == path]:
                del origins[old]
            line = layer.lines.get(path)
            origins[path] = (
                f"{layer.origin}:{line}"
                if line
                else f"flag {dotted(path)}"
                if layer.origin == "flag"
                else layer.origin
            )
        for path in [p for p in where if any(p[: len(lp)] == lp for lp, _ in _leaves(layer.data))]:
            del where[path]
        for path, line in layer.lines.items():
            where[path] = (layer.file, line)
        for path, _ in _leaves(layer.data):
            where.setdefault(path, (layer.file, None))
        for k in layer.locks:
            locks.setdefault(k, layer.file or "?")
    if quoted:
        wants = cache.memo("quoted", {"paths": [list(p) for p, _, _ in quoted]}, _quoted_wants)
        for (path, value, layer), want in zip(quoted, wants, strict=True):
            if want:
                problems.append(
                    Problem(
                        f"{value!r} is quoted text; fix: {want} without quotes",
                        file=layer.file,
                        line=layer.lines.get(path),
                        key=dotted(path),
                    )
                )
    merged = cache.memo("drop_nulls", merged, _drop_nulls)
    merged["locked"] = list(dict.fromkeys(locks))
    if docs:
        for key in ("name", "extends"):  # never inherited
            merged.pop(key, None)
            if docs[0].data.get(key) is not None:
                merged[key] = docs[0].data[key]
        where.setdefault(("locked",), (str(docs[0].path), docs[0].lines.get(("locked",))))

    profile: Profile | ProfileView | None = None
    if docs and not problems:
        profile = cache.lookup(merged)  # the same input validated before: no pydantic
    if docs and profile is None:
        try:
            model: Profile = schema.Profile.model_validate(merged)
            profile = model
            if not problems:
                cache.store(merged, model)
        except schema.ValidationError as e:
            errors = e.errors()
            problems += _problems(
                errors + _more_cross_field(merged, errors), where, str(docs[0].path)
            )
    if problems:
        raise ValidationError(_dedupe(problems))
    assert profile is not None
    profile._source = docs[0].path
    profile._chain = [d.path for d in docs]
    profile._origins = _origins(profile.model_dump(), origins)
    return profile


def _origins(values: dict[str, Any], explicit: dict[Path_, str]) -> dict[str, str]:
    out = {}
    for path, _ in _leaves(values):
        origin = "default"
        for n in range(len(path), 0, -1):
            if path[:n] in explicit:
                origin = explicit[path[:n]]
                break
        out[dotted(path)] = origin
    return out


# ---------------------------------------------------------------------------------------------
# The public entry point


def default_profile_name() -> str:
    problems: list[Problem] = []
    default, _ = _user_config(problems)
    if problems:
        raise ValidationError(problems)
    if default:
        return default
    if shutil.which("sbatch") is None:
        return "local"
    names = sorted({e.name for e in discover()})
    raise UserError(
        "no profile given and this machine has Slurm; fix: pass --profile NAME "
        f"(available: {', '.join(names)}) or set `default_profile: NAME` in "
        f"{config_home() / 'config.yaml'}"
    )


def resolve(
    name_or_path: str | None = None, flags: dict[str, object] | None = None
) -> ResolvedProfile:
    """The fully validated, merged profile for a name (discovery) or a file path.

    With no name: the user config's `default_profile`, else `local` when `sbatch` is not on
    PATH, else an error listing the available names.
    """
    ref = name_or_path if name_or_path is not None else default_profile_name()
    path = Path(ref).expanduser()
    if _looks_like_path(ref) or (path.is_file() and not any(e.name == ref for e in discover())):
        if not path.is_file():
            raise UserError(
                f"profile file {ref} does not exist; fix: check the path, or give a "
                "profile name (`hpctrain profiles list`)"
            )
        return resolve_file(path, flags)
    return resolve_file(find(ref), flags, expect_name=ref)
