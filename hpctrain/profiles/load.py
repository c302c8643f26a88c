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
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.kernel.errors import Problem, UserError, ValidationError
from hpctrain.kernel.yamlsafe import Doc, Path_, dotted
from hpctrain.profiles import cache, schema
from hpctrain.profiles.discovery import (  # noqa: F401  (_is_bundled: the tests ask the loader)
    _is_bundled,
    _looks_like_path,
    check_trust,
    config_home,
    discover,
    find,
    profile_name,
)
from hpctrain.profiles.layers import (
    Stack,
    _drop_nulls,
    _flags_layer,
    _Layer,
    _leaves,
    _user_config,
)
from hpctrain.profiles.problems import (
    NAME_MISSING,
    _dedupe,
    _more_cross_field,
    _problems,
    _quoted_wants,
    reads_as,
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


def _unknown_keys(data: Mapping[str, list[str]]) -> list[str]:
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
    stack = Stack()
    for layer in _layers(docs, flags, problems, user_config=user_config, expect_name=expect_name):
        stack.add(layer, problems)
    problems += _quoted(stack.quoted)
    merged = cache.memo("drop_nulls", stack.merged, _drop_nulls)
    merged["locked"] = list(dict.fromkeys(stack.locks))
    if docs:
        for key in ("name", "extends"):  # never inherited
            merged.pop(key, None)
            if docs[0].data.get(key) is not None:
                merged[key] = docs[0].data[key]
        stack.where.setdefault(("locked",), (str(docs[0].path), docs[0].lines.get(("locked",))))
    profile = _validate(merged, stack.where, str(docs[0].path), problems) if docs else None
    if problems:
        raise ValidationError(_dedupe(problems))
    assert profile is not None
    profile._source = docs[0].path
    profile._chain = [d.path for d in docs]
    profile._origins = _origins(profile.model_dump(), stack.origins)
    return profile


def _layers(
    docs: list[Doc],
    flags: dict[str, object] | None,
    problems: list[Problem],
    *,
    user_config: bool,
    expect_name: str | None,
) -> list[_Layer]:
    """The layers, lowest first: the extends chain (root first), the user config, the flags."""
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
    return layers


def _quoted(quoted: list[tuple[Path_, str, _Layer]]) -> list[Problem]:
    """A quoted value where the schema wants a bool or a number (the schema would accept it)."""
    if not quoted:
        return []
    wants = cache.memo("quoted", {"paths": [list(p) for p, _, _ in quoted]}, _quoted_wants)
    return [
        Problem(
            f"{value!r} is quoted text; fix: {want} without quotes",
            file=layer.file,
            line=layer.lines.get(path),
            key=dotted(path),
        )
        for (path, value, layer), want in zip(quoted, wants, strict=True)
        if want and reads_as(value, want)  # else not quoted: the schema's message says it
    ]


def _validate(
    merged: dict[str, object],
    where: dict[Path_, tuple[str | None, int | None]],
    top: str,
    problems: list[Problem],
) -> Profile | ProfileView | None:
    """The merged input validated: from the cache when the same input was validated before (no
    pydantic), else by the schema; None when it is invalid (its problems appended)."""
    if not problems:
        hit = cache.lookup(merged)
        if hit is not None:
            return hit
    try:
        model: Profile = schema.Profile.model_validate(merged)
    except schema.ValidationError as e:
        errors = e.errors()
        problems += _problems(errors + _more_cross_field(merged, errors), where, top)
        return None
    if not problems:
        cache.store(merged, model)
    return model


def _origins(values: Mapping[str, object], explicit: dict[Path_, str]) -> dict[str, str]:
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
    names = sorted({e.name for e in discover(examples=False)})
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
    return resolve_file(find(ref), flags, expect_name=profile_name(ref))
