"""The layers a profile is resolved from, above the extends chain: the user config
($XDG_CONFIG_HOME/hpctrain/config.yaml) and command-line flags, each with its origins."""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from typing import Any

from hpctrain.kernel.errors import Problem
from hpctrain.kernel.yamlsafe import MAX_INT, Path_, _bad_text
from hpctrain.profiles import schema
from hpctrain.profiles.discovery import check_trust, config_home
from hpctrain.profiles.yamlsafe import read_yaml

# ---------------------------------------------------------------------------------------------
# Layers


@dataclass
class _Layer:
    data: dict[str, Any]
    lines: dict[Path_, int]
    file: str | None  # for problems
    origin: str  # prefix for origins: a path, "user config <path>", "flag"
    locks: list[str] = field(default_factory=list)


# Any: parsed YAML of any shape
def _leaves(data: Any, path: Path_ = ()) -> list[tuple[Path_, Any]]:
    if isinstance(data, dict) and data:
        return [leaf for k, v in data.items() for leaf in _leaves(v, (*path, k))]
    return [(path, data)]


def _get(data: Any, path: Path_) -> Any:  # Any: parsed YAML of any shape
    for part in path:
        if not isinstance(data, dict) or part not in data:
            return _MISSING
        data = data[part]
    return data


_MISSING = object()


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _drop_nulls(data: dict[str, Any], path: Path_ = ()) -> dict[str, Any]:
    """`key: null` resets a key to its default: drop nulls where the default is not null
    (an empty `slurm:` section, `extra_sbatch: null`, ...)."""
    # Any: parsed YAML of any shape
    model: Any = False  # looked up at the first null only (no schema otherwise)
    out = {}
    for k, v in data.items():
        if v is None:
            if model is False:
                model = schema.model_at((*path, ""))
            field = model.model_fields.get(k) if model else None
            if field is not None and (
                field.default_factory is not None
                or field.default not in (None, schema.PydanticUndefined)
            ):
                continue
        out[k] = _drop_nulls(v, (*path, k)) if isinstance(v, dict) else v
    return out


def _covers(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


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


def _flags_layer(flags: dict[str, object], problems: list[Problem]) -> _Layer:
    data: dict[str, Any] = {}
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
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                break
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
