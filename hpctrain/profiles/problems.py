"""pydantic's errors as located problems (`file:line: dotted.key: message; fix`), all at once."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING

from hpctrain.kernel.errors import Problem
from hpctrain.kernel.yamlsafe import Path_, dotted
from hpctrain.profiles import schema

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

NAME_MISSING = "required key is missing; fix: add `name: NAME` (every profile file names itself)"


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen, out = set(), []
    for p in problems:
        if str(p) not in seen:
            seen.add(str(p))
            out.append(p)
    return sorted(out, key=lambda p: (p.file or "", p.line or 0))


_FIX = {
    "int_type": "write a whole number without quotes",
    "int_parsing": "write a whole number without quotes",
    "int_from_float": "write a whole number",
    "float_type": "write a number",
    "float_parsing": "write a number",
    "bool_type": "write true or false",
    "bool_parsing": "write true or false",
    "string_type": "write text (quote it if it looks like a number, a date or true/false)",
    "list_type": "write a YAML list: [a, b] or one `- item` per line",
    "dict_type": "write a mapping of `key: value` lines",
    "model_type": "write a mapping of `key: value` lines",
    "model_attributes_type": "write a mapping of `key: value` lines",
    "literal_error": "use one of the values listed",
    "greater_than_equal": "use a larger value (counts cannot be negative)",
    "greater_than": "use a larger value",
    "less_than_equal": "use a smaller value",
    "missing": "add it",
}


# text where the schema wants a number or a bool, and that does not read as one: (what, example)
_NOT_A = {
    "int_parsing": ("a whole number", "8"),
    "float_parsing": ("a number", "0.5"),
    "bool_parsing": ("true or false", "true"),
}
_BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "t", "f", "y", "n", "1", "0"}


def reads_as(value: str, want: str) -> bool:
    """Whether the text `value` is what `want` (a _quoted_instead_of answer) asks for, so that
    it must have been quoted to be text: `'4'`, `'true'`. Text that reads as nothing of the kind
    (`eight`) is the schema's one problem, not a quoting one."""
    text = value.strip()
    if want == "write true or false":
        return text.lower() in _BOOL_WORDS
    try:
        number = float(text)
    except ValueError:
        return False
    return number.is_integer() if want == "write a whole number" else True


def _more_cross_field(
    merged: Mapping[str, object], errors: list[ErrorDetails]
) -> list[ErrorDetails]:
    """Cross-field checks of sections whose other keys had errors (pydantic skips them), run
    on the keys that were fine, so that every problem of a file is reported at once."""
    out: list[ErrorDetails] = []
    for name, model in schema.SECTIONS.items():
        bad = {e["loc"][1] for e in errors if e["loc"][:1] == (name,) and len(e["loc"]) > 1}
        section = merged.get(name)
        if not bad or not isinstance(section, dict):
            continue
        try:
            model.model_validate({k: v for k, v in section.items() if k not in bad})
        except schema.ValidationError as e:
            for err in e.errors():
                if err["type"] == "cross_field":
                    err["loc"] = (name, *err["loc"])
                    out.append(err)
    return out


def _problems(
    errors: list[ErrorDetails], where: dict[Path_, tuple[str | None, int | None]], top: str
) -> list[Problem]:
    out = []
    for err in errors:
        loc = tuple(p for p in err["loc"] if p != "[key]")
        items = [(loc, err["msg"])]
        if err["type"] == "cross_field":
            items = [((*loc, f), m) for f, m in err["ctx"]["items"]]
        for path, msg in items:
            file: str | None = top
            line: int | None = None
            for n in range(len(path), -1, -1):
                if path[:n] in where:
                    file, line = where[path[:n]]
                    break
            out.append(Problem(_message(err, path, msg), file=file, line=line, key=dotted(path)))
    return out


def _message(err: ErrorDetails, path: Path_, msg: str) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        model = schema.model_at(path)
        names = list(model.model_fields) if model else []
        close = difflib.get_close_matches(str(path[-1]), names, n=1, cutoff=0.6)
        if close:
            return f"unknown key; did you mean {close[0]!r}?"
        return f"unknown key; fix: remove it (valid keys here: {', '.join(names)})"
    if kind == "value_error":
        return msg.removeprefix("Value error, ")
    if kind == "cross_field":
        return msg
    got = err.get("input")
    if kind in _NOT_A and isinstance(got, str):  # `gpus_per_node: eight`: one plain sentence
        what, example = _NOT_A[kind]
        return f"{got!r} is not {what}; fix: write {what}, e.g. `{path[-1]}: {example}`"
    shown = f" (got {got!r})" if isinstance(got, str | int | float | bool) else ""
    if kind == "missing":
        return NAME_MISSING if path == ("name",) else "required key is missing; fix: add it"
    return f"{msg}{shown}; fix: {_FIX.get(kind, 'see docs/site-profiles.md')}"


def _quoted_instead_of(path: Path_) -> str | None:
    """For a text value at `path`: what the schema wants when that is a bool or a number only
    (`exclusive: 'true'`, `max_nodes: '4'` were accepted although the messages said no quotes)."""
    model = schema.model_at(path) if path and isinstance(path[-1], str) else None
    field = model.model_fields.get(str(path[-1])) if model else None
    if field is None:
        return None
    types = set(typing.get_args(field.annotation)) or {field.annotation}
    if str in types or not types & {bool, int, float}:
        return None
    return (
        "write true or false"
        if bool in types
        else ("write a whole number" if int in types else "write a number")
    )


def _quoted_wants(data: Mapping[str, list[list[str | int]]]) -> list[str | None]:
    return [_quoted_instead_of(tuple(p)) for p in data["paths"]]
