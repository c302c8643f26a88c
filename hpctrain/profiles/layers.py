"""The layers a profile is resolved from, above the extends chain: the user config
($XDG_CONFIG_HOME/hpctrain/config.yaml) and command-line flags, each with its origins; and how the
layers stack, lowest first, into the merged input the schema validates."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import field
from typing import TYPE_CHECKING

from hpctrain.kernel.errors import Problem
from hpctrain.kernel.values import mutable
from hpctrain.kernel.yamlsafe import MAX_INT, Path_, _bad_text, dotted
from hpctrain.profiles import locks, schema
from hpctrain.profiles.discovery import check_trust, config_home
from hpctrain.profiles.yamlsafe import read_yaml

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

# ---------------------------------------------------------------------------------------------
# Layers


@mutable
class _Layer:
    data: Mapping[str, object]
    lines: dict[Path_, int]
    file: str | None  # for problems
    origin: str  # prefix for origins: a path, "user config <path>", "flag"
    locks: list[str] = field(default_factory=list)


def _leaves(data: object, path: Path_ = ()) -> list[tuple[Path_, object]]:
    if isinstance(data, dict) and data:
        return [leaf for k, v in data.items() for leaf in _leaves(v, (*path, k))]
    return [(path, data)]


def _get(data: object, path: Path_) -> object:
    for part in path:
        if not isinstance(data, dict) or part not in data:
            return _MISSING
        data = data[part]
    return data


_MISSING = object()


def _merge(base: Mapping[str, object], top: Mapping[str, object]) -> dict[str, object]:
    out = dict(base)
    for k, v in top.items():
        old = out.get(k)
        if isinstance(v, dict) and isinstance(old, dict):
            out[k] = _merge(old, v)
        else:
            out[k] = v
    return out


def _drop_nulls(data: Mapping[str, object], path: Path_ = ()) -> dict[str, object]:
    """`key: null` resets a key to its default: drop nulls where the default is not null
    (an empty `slurm:` section, `extra_sbatch: null`, ...)."""
    fields: dict[str, FieldInfo] | None = None  # looked up at the first null only (no schema else)
    out = {}
    for k, v in data.items():
        if v is None:
            if fields is None:
                model = schema.model_at((*path, ""))
                fields = dict(model.model_fields) if model else {}
            found = fields.get(k)
            if found is not None and (
                found.default_factory is not None
                or found.default not in (None, schema.PydanticUndefined)
            ):
                continue
        out[k] = _drop_nulls(v, (*path, k)) if isinstance(v, dict) else v
    return out


@mutable
class Stack:
    """The layers merged in order, where each value came from, and what is locked."""

    merged: dict[str, object] = field(default_factory=dict)
    origins: dict[Path_, str] = field(default_factory=dict)  # "file:line", "flag KEY", a layer
    where: dict[Path_, tuple[str | None, int | None]] = field(default_factory=dict)  # problems'
    locks: dict[str, str] = field(default_factory=dict)  # dotted key -> the file that locked it
    # text values where the schema may want bools or numbers
    quoted: list[tuple[Path_, str, _Layer]] = field(default_factory=list)

    def add(self, layer: _Layer, problems: list[Problem]) -> None:
        """Put `layer` on top: a value it sets under a lock of the layers below is a problem."""
        for path, value in _leaves(layer.data):
            if not path or path == ("locked",):
                continue
            if (
                layer.origin != "flag"
                and isinstance(value, str)
                and all(isinstance(p, str) for p in path)
            ):
                self.quoted.append((path, value, layer))
            self._check_lock(layer, path, value, problems)
        self.merged = _merge(self.merged, {k: v for k, v in layer.data.items() if k != "locked"})
        self._track(layer)
        for k in layer.locks:
            self.locks.setdefault(k, layer.file or "?")

    def _check_lock(
        self, layer: _Layer, path: Path_, value: object, problems: list[Problem]
    ) -> None:
        locked = locks.covering_lock(self.locks, path)
        if locked is None or _get(self.merged, path) == value:
            return
        key = dotted(path)
        also = "" if locks.covers(key, locked) else f" ({key} sets what {locked} covers)"
        problems.append(
            Problem(
                f"{locked} is locked by profile {self.locks[locked]}{also}; fix: remove {key} "
                "here (ask the profile's admin if it must change)",
                file=layer.file,
                line=layer.lines.get(path),
                key=key,
            )
        )

    def _track(self, layer: _Layer) -> None:
        """The origin and the file and line of every value `layer` sets (replacing what it
        replaces)."""
        leaves = [path for path, _ in _leaves(layer.data)]
        for path in leaves:
            if not path:
                continue
            for old in [p for p in self.origins if p[: len(path)] == path]:
                del self.origins[old]
            line = layer.lines.get(path)
            self.origins[path] = (
                f"{layer.origin}:{line}"
                if line
                else f"flag {dotted(path)}"
                if layer.origin == "flag"
                else layer.origin
            )
        for path in [p for p in self.where if any(p[: len(lp)] == lp for lp in leaves)]:
            del self.where[path]
        for path, line in layer.lines.items():
            self.where[path] = (layer.file, line)
        for path in leaves:
            self.where.setdefault(path, (layer.file, None))


def _user_config(problems: list[Problem]) -> tuple[str | None, _Layer | None]:
    """(default_profile, overrides layer) from $XDG_CONFIG_HOME/hpctrain/config.yaml."""
    path = config_home() / "config.yaml"
    if not path.is_file():
        return None, None
    check_trust(path)
    doc = read_yaml(path, problems)
    if doc is None:
        return None, None
    default, overrides = doc.data.get("default_profile"), doc.data.get("overrides") or {}
    for key in doc.data:
        if key not in ("default_profile", "overrides"):
            close = difflib.get_close_matches(key, ["default_profile", "overrides"], n=1)
            hint = f"did you mean {close[0]!r}?" if close else "fix: remove it"
            problems.append(
                Problem(
                    f"unknown key; {hint} (the user config holds default_profile and overrides)",
                    file=str(path),
                    line=doc.lines[(key,)],
                    key=key,
                )
            )
    if default is not None and not isinstance(default, str):
        problems.append(
            Problem(
                "not a profile name; fix: write `default_profile: NAME`",
                file=str(path),
                line=doc.lines[("default_profile",)],
                key="default_profile",
            )
        )
        default = None
    if not isinstance(overrides, dict):
        problems.append(
            Problem(
                "not a mapping; fix: write profile keys under `overrides:`, e.g. "
                "`slurm: {account: myproj}`",
                file=str(path),
                line=doc.lines[("overrides",)],
                key="overrides",
            )
        )
        return default, None
    for key in ("name", "extends", "locked"):
        if key in overrides:
            problems.append(
                Problem(
                    f"{key} cannot be overridden; fix: remove it from overrides",
                    file=str(path),
                    line=doc.lines[("overrides", key)],
                    key=f"overrides.{key}",
                )
            )
            overrides = {k: v for k, v in overrides.items() if k != key}
    lines = {p[1:]: n for p, n in doc.lines.items() if p[:1] == ("overrides",)}
    return default, _Layer(overrides, lines, str(path), f"user config {path}")


def _flags_layer(flags: Mapping[str, object], problems: list[Problem]) -> _Layer:
    data: dict[str, object] = {}
    for key, value in flags.items():
        parts = key.split(".")
        if parts[0] in ("name", "extends", "locked"):
            problems.append(
                Problem(
                    f"{parts[0]} cannot be set from the command line", file="command line", key=key
                )
            )
            continue
        bad = _bad_flag_value(value)
        if bad:
            problems.append(Problem(bad, file="command line", key=key))
            continue
        node = data
        for part in parts[:-1]:
            inner = node.setdefault(part, {})
            if not isinstance(inner, dict):
                break
            node = inner
        else:
            node[parts[-1]] = value
            continue
        problems.append(
            Problem(
                f"{key} sets a key under a value that is not a section; fix: set one of them",
                file="command line",
                key=key,
            )
        )
    return _Layer(data, {}, "command line", "flag")


def _bad_flag_value(value: object) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if (
        isinstance(value, int)
        and abs(value) > MAX_INT
        or (isinstance(value, str) and re.fullmatch(r"[-+]?[0-9_]{19,}", value))
    ):
        return f"the number {str(value)[:20]}... is far too large; fix: write a realistic value"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number; fix: write a plain number"
    return _bad_text(value) if isinstance(value, str) else None
