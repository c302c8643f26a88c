"""Safe YAML with line numbers: what every profile file and the user config are read with.

No tags, anchors, aliases or merge keys; at most MAX_DEPTH levels and MAX_BYTES; integers within
MAX_INT, finite floats, no control characters or undecodable text; dates and YAML 1.1 base-60
numbers (`1:30`) stay text. Every problem is a `file:line: key: message; fix` (docs/security.md).

Torch-free and cache-free (hpctrain.kernel): profiles pass their parse cache (hpctrain.profiles
.yamlsafe), train_entry's config loader reads with no cache, so training ranks write nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml
from yaml.events import AliasEvent, CollectionStartEvent, NodeEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from hpctrain.kernel.errors import Problem

MAX_BYTES = 256 * 1024
MAX_DEPTH = 8
MAX_INT = 2**63 - 1  # bash arithmetic and every consumer of a count stop here
Path_ = tuple[str | int, ...]  # a key path inside a document: ("slurm", "extra_sbatch", 0)


class ParseCache(Protocol):
    """What read_yaml may reuse: the data and key lines of a text read before without a problem."""

    def parsed(self, text: str) -> tuple[dict[str, Any], dict[Path_, int]] | None: ...

    # Any: PyYAML nodes, events and marks (untyped)
    def store_parsed(self, text: str, data: Any, lines: dict[Path_, int]) -> None: ...


class _Stop(Exception):
    """A problem after which the rest of the file cannot be read."""


# ---------------------------------------------------------------------------------------------
# Safe YAML


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses tags, anchors/aliases and deep nesting, and keeps dates as text."""

    yaml_implicit_resolvers = {
        ch: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, text: str, file: str, problems: list[Problem]) -> None:
        super().__init__(text)
        self.file, self.problems, self.depth = file, problems, 0

    def construct_yaml_int(self, node: Any) -> Any:  # Any: PyYAML nodes, events and marks (untyped)
        # YAML 1.1 reads 1:30 as 90 (base 60): keep such a value as the text it looks like
        if ":" in str(node.value):
            return str(node.value)
        return super().construct_yaml_int(node)

    # Any: PyYAML nodes, events and marks (untyped)
    def construct_yaml_float(self, node: Any) -> Any:
        if ":" in str(node.value):
            return str(node.value)
        return super().construct_yaml_float(node)

    def problems_of_file(self, file: str) -> list[Problem]:
        return [p for p in self.problems if p.file == file and p.key is None]

    # Any: PyYAML nodes, events and marks (untyped)
    def _problem(self, event: Any, message: str) -> None:
        self.problems.append(Problem(message, file=self.file, line=event.start_mark.line + 1))

    # Any: PyYAML nodes, events and marks (untyped)
    def compose_node(self, parent: Any, index: Any) -> Any:
        # Any: PyYAML nodes, events and marks (untyped)
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, AliasEvent):
            self.get_event()  # type: ignore[no-untyped-call]
            self._problem(
                event,
                f"alias *{event.anchor} is not allowed; fix: write the value out "
                "(profiles reuse values through `extends`, not YAML anchors)",
            )
            # Any: PyYAML nodes, events and marks (untyped)
            marks: Any = (event.start_mark, event.end_mark)
            return ScalarNode("tag:yaml.org,2002:null", "", *marks)
        if isinstance(event, NodeEvent):
            ev: Any = event  # Any: PyYAML nodes, events and marks (untyped)
            if ev.anchor is not None:
                self._problem(
                    event,
                    f"anchor &{ev.anchor} is not allowed; fix: remove it "
                    "(profiles reuse values through `extends`, not YAML anchors)",
                )
                ev.anchor = None
            if ev.tag is not None:
                tag = ev.tag.replace("tag:yaml.org,2002:", "!!")
                self._problem(
                    event,
                    f"tag {tag} is not allowed (no tag may construct "
                    "objects); fix: remove the tag and write a plain value",
                )
                ev.tag = None
        if isinstance(event, CollectionStartEvent):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                self._problem(
                    event,
                    f"nested deeper than {MAX_DEPTH} levels; fix: profiles are "
                    "at most a few levels deep, check the indentation",
                )
                raise _Stop
        node = super().compose_node(parent, index)
        if isinstance(event, CollectionStartEvent):
            self.depth -= 1
        return node


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.construct_yaml_float)


def yaml_scalar(text: str) -> Any:
    """A `--set` value read as the same YAML scalar a profile file would give (1:30 stays text);
    anything that is not a plain scalar stays the text as typed."""
    problems: list[Problem] = []
    try:
        loader = _Loader(text, "command line", problems)
    except yaml.YAMLError:
        return text  # control characters: the flags layer reports them
    try:
        node = loader.get_single_node()
        value = _scalar_value(loader, node) if isinstance(node, ScalarNode) else text
    except (yaml.YAMLError, ValueError, _Stop):
        return text
    finally:
        loader.dispose()
    if problems or not (value is None or isinstance(value, str | int | float | bool)):
        return text
    return value


class _BadScalar(ValueError):
    pass


def _scalar_value(loader: _Loader, node: ScalarNode) -> Any:
    """One scalar, or _BadScalar saying what is wrong with it and how to fix it."""
    if node.tag.endswith(":merge"):
        raise _BadScalar(
            "the YAML merge key << is not allowed; fix: write the keys out (profiles "
            "reuse values through `extends`)"
        )
    try:
        value = loader.construct_object(node)
    except ValueError:  # e.g. more digits than Python converts (int_max_str_digits)
        raise _BadScalar(
            f"the number {node.value[:20]}... is far too large; fix: write a realistic value"
        ) from None
    except yaml.YAMLError as e:
        raise _BadScalar(
            f"cannot read this value ({getattr(e, 'problem', None) or e}); fix: quote it as text"
        ) from None
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise _BadScalar(
            f"the number {str(value)[:20]}... is larger than {MAX_INT}; fix: write a "
            "realistic value"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise _BadScalar(f"{node.value!r} is not a finite number; fix: write a plain number")
    if isinstance(value, str):
        bad = _bad_text(value)
        if bad:
            raise _BadScalar(bad)
    return value


def _bad_text(value: str) -> str | None:
    """Text that cannot be carried: unencodable (lone surrogates) or with control characters."""
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        return "the text is not valid Unicode (undecodable bytes); fix: write it in UTF-8"
    if any((ord(c) < 32 and c not in "\t\n") or 0x7F <= ord(c) < 0xA0 for c in value):
        return f"{value[:40]!r} contains a control character; fix: remove it (write plain text)"
    return None


@dataclass
class Doc:
    """One YAML file: its data and the line of every key path."""

    path: Path
    data: dict[str, Any]
    lines: dict[Path_, int]


def read_yaml(
    path: Path,
    problems: list[Problem],
    *,
    cache: ParseCache | None = None,
    empty_ok: bool = False,
    top_fix: str = "write `key: value` lines, starting with `name: NAME`",
) -> Doc | None:
    """Load one file safely. Appends every problem found; returns None when nothing usable.

    `cache` (profiles only) skips parsing a text read before; `empty_ok` reads an empty file as {}.
    """
    file = str(path)

    def fail(message: str, line: int | None = None) -> None:
        problems.append(Problem(message, file=file, line=line))

    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            fail(
                f"file is {size} bytes, more than the {MAX_BYTES} allowed; fix: a profile is a "
                "short YAML file, check that this is the right file"
            )
            return None
        raw = path.read_bytes()
    except OSError as e:
        fail(f"cannot read: {e.strerror}; fix: check the path and its permissions")
        return None
    if b"\x00" in raw:
        fail("binary file (NUL bytes); fix: a profile is a UTF-8 YAML text file")
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        fail("not UTF-8 text; fix: save the file as UTF-8", line)
        return None
    parsed = cache.parsed(text) if cache is not None else None  # read before, no problem
    if parsed is not None:
        return Doc(path, *parsed)
    before = len(problems)
    try:
        loader = _Loader(text, file, problems)  # the reader refuses control characters here
    except yaml.YAMLError as err:
        ye: Any = err  # Any: PyYAML nodes, events and marks (untyped)
        # Any: PyYAML nodes, events and marks (untyped)
        mark: Any = getattr(ye, "problem_mark", None) or getattr(ye, "position", None)
        where: int | None = (
            mark.line + 1
            if hasattr(mark, "line")
            else text[: ye.position].count("\n") + 1
            if isinstance(getattr(ye, "position", None), int)
            else None
        )
        fail(
            "contains a control character YAML does not allow; fix: remove it (write plain text)",
            where,
        )
        return None
    try:
        node = loader.get_single_node()
    except _Stop:
        return None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        what = getattr(e, "problem", None) or str(e)
        fail(
            f"not valid YAML: {what}; fix: check the indentation and quoting near this line",
            mark.line + 1 if mark else None,
        )
        return None
    finally:
        loader.dispose()
    if node is None or (isinstance(node, ScalarNode) and node.tag.endswith(":null")):
        if empty_ok:
            return Doc(path, {}, {})
        fail("empty file; fix: a profile needs at least `name: NAME`")
        return None
    if not isinstance(node, MappingNode):
        fail(
            f"the top level is not a mapping; fix: {top_fix}",
            node.start_mark.line + 1,
        )
        return None
    lines: dict[Path_, int] = {}
    first = len(problems)
    data = _build(loader, node, (), lines, file, problems)
    by_line = {n: p for p, n in sorted(lines.items(), key=lambda kv: -len(kv[0]))}
    for p in problems[first:] + loader.problems_of_file(file):
        if p.key is None and p.line in by_line:
            p.key = dotted(by_line[p.line])
    if cache is not None and len(problems) == before:
        cache.store_parsed(text, data, lines)
    return Doc(path, data, lines)


def _build(
    loader: _Loader,
    node: Any,  # Any: PyYAML nodes, events and marks (untyped)
    path: Path_,
    lines: dict[Path_, int],
    file: str,
    problems: list[Problem],
) -> Any:
    if isinstance(node, MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            try:
                key = _scalar_value(loader, key_node) if isinstance(key_node, ScalarNode) else None
            except _BadScalar as e:
                problems.append(Problem(str(e), file=file, line=line, key=dotted(path) or None))
                continue
            if not isinstance(key, str):
                problems.append(
                    Problem(
                        f"key {key!r} is not text; fix: write keys as plain names",
                        file=file,
                        line=line,
                        key=dotted(path) or None,
                    )
                )
                continue
            if key in out:
                problems.append(
                    Problem(
                        f"duplicate key (first on line {lines[(*path, key)]}); "
                        "fix: keep one of them",
                        file=file,
                        line=line,
                        key=dotted((*path, key)),
                    )
                )
                continue
            lines[(*path, key)] = line
            out[key] = _build(loader, value_node, (*path, key), lines, file, problems)
        return out
    if isinstance(node, SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            items.append(_build(loader, item, (*path, i), lines, file, problems))
        return items
    try:
        return _scalar_value(loader, node)
    except _BadScalar as e:
        problems.append(
            Problem(str(e), file=file, line=node.start_mark.line + 1, key=dotted(path) or None)
        )
        return None


def dotted(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
