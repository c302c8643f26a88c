"""Safe YAML with line numbers: what every profile file and the user config are read with.

No tags, anchors, aliases or merge keys; at most MAX_DEPTH levels and MAX_BYTES; integers within
MAX_INT, finite floats, no control characters or undecodable text; dates and YAML 1.1 base-60
numbers (`1:30`) stay text. Every problem is a `file:line: key: message; fix` (docs/security.md).

Torch-free and cache-free (hpctrain.kernel): profiles pass their parse cache (hpctrain.profiles
.yamlsafe), train_entry's config loader reads with no cache, so training ranks write nothing.
"""

from __future__ import annotations

import math
from dataclasses import field
from pathlib import Path
from typing import Protocol, TypeAlias

import yaml
from yaml.error import Mark
from yaml.events import AliasEvent, CollectionStartEvent, Event, NodeEvent, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from hpctrain.kernel.errors import Problem
from hpctrain.kernel.values import mutable

MAX_BYTES = 256 * 1024
MAX_DEPTH = 8
MAX_INT = 2**63 - 1  # bash arithmetic and every consumer of a count stop here
Path_ = tuple[str | int, ...]  # a key path inside a document: ("slurm", "extra_sbatch", 0)
Scalar: TypeAlias = str | int | float | bool | None
# What a safe YAML (or JSON) document holds: scalars, lists, mappings with text keys.
Yaml: TypeAlias = "Scalar | list[Yaml] | dict[str, Yaml]"


class ParseCache(Protocol):
    """What read_yaml may reuse: the data and key lines of a text read before without a problem."""

    def parsed(self, text: str) -> tuple[dict[str, Yaml], dict[Path_, int]] | None: ...

    def store_parsed(self, text: str, data: dict[str, Yaml], lines: dict[Path_, int]) -> None: ...


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

    def int_or_text(self, node: ScalarNode) -> int | str:
        # YAML 1.1 reads 1:30 as 90 (base 60): keep such a value as the text it looks like
        if ":" in str(node.value):
            return str(node.value)
        return self.construct_yaml_int(node)

    def float_or_text(self, node: ScalarNode) -> float | str:
        if ":" in str(node.value):
            return str(node.value)
        return self.construct_yaml_float(node)

    def problems_of_file(self, file: str) -> list[Problem]:
        return [p for p in self.problems if p.file == file and p.key is None]

    def _problem(self, event: Event, message: str) -> None:
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        self.problems.append(Problem(message, file=self.file, line=line))

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        event: Event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, AliasEvent):
            self.get_event()  # type: ignore[no-untyped-call]
            self._problem(
                event,
                f"alias *{event.anchor} is not allowed; fix: write the value out "
                "(profiles reuse values through `extends`, not YAML anchors)",
            )
            return ScalarNode("tag:yaml.org,2002:null", "", *_marks(event))
        if isinstance(event, NodeEvent):
            self._refuse_anchor_and_tag(event)
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

    def _refuse_anchor_and_tag(self, event: NodeEvent) -> None:
        """Report an anchor or a tag, and read on as if it were not there."""
        if event.anchor is not None:
            self._problem(
                event,
                f"anchor &{event.anchor} is not allowed; fix: remove it "
                "(profiles reuse values through `extends`, not YAML anchors)",
            )
            event.anchor = None
        if isinstance(event, ScalarEvent | CollectionStartEvent) and event.tag is not None:
            tag = event.tag.replace("tag:yaml.org,2002:", "!!")
            self._problem(
                event,
                f"tag {tag} is not allowed (no tag may construct "
                "objects); fix: remove the tag and write a plain value",
            )
            event.tag = None


def _marks(event: Event) -> tuple[Mark | None, Mark | None]:
    """An event's marks as a node takes them (the pure-Python reader's, never the C reader's)."""
    start, end = event.start_mark, event.end_mark
    return (
        start if isinstance(start, Mark) else None,
        end if isinstance(end, Mark) else None,
    )


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.int_or_text)
_Loader.add_constructor("tag:yaml.org,2002:float", _Loader.float_or_text)


def yaml_scalar(text: str) -> Scalar:
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


def _scalar_value(loader: _Loader, node: ScalarNode) -> Scalar:
    """One scalar, or _BadScalar saying what is wrong with it and how to fix it."""
    if node.tag.endswith(":merge"):
        raise _BadScalar(
            "the YAML merge key << is not allowed; fix: write the keys out (profiles "
            "reuse values through `extends`)"
        )
    try:
        # the safe resolvers, without tags and dates, construct nothing but these
        value: Scalar = loader.construct_object(node)
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


@mutable
class Doc:
    """One YAML file: its data and the line of every key path."""

    path: Path
    data: dict[str, Yaml]
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
    text = _text(path, problems)
    if text is None:
        return None
    parsed = cache.parsed(text) if cache is not None else None  # read before, no problem
    if parsed is not None:
        return Doc(path, *parsed)
    before = len(problems)
    loaded = _compose(text, file, problems)
    if loaded is None:
        return None
    loader, node = loaded
    if node is None or (isinstance(node, ScalarNode) and node.tag.endswith(":null")):
        if empty_ok:
            return Doc(path, {}, {})
        problems.append(
            Problem("empty file; fix: a profile needs at least `name: NAME`", file=file)
        )
        return None
    if not isinstance(node, MappingNode):
        problems.append(
            Problem(
                f"the top level is not a mapping; fix: {top_fix}",
                file=file,
                line=node.start_mark.line + 1,
            )
        )
        return None
    builder = _Builder(loader, file, problems)
    first = len(problems)
    data = builder.mapping(node, ())
    builder.name_keys(first=first)
    if cache is not None and len(problems) == before:
        cache.store_parsed(text, data, builder.lines)
    return Doc(path, data, builder.lines)


def _text(path: Path, problems: list[Problem]) -> str | None:
    """The file as text, or None with the problem: too large, unreadable, binary, not UTF-8."""
    file = str(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            problems.append(
                Problem(
                    f"file is {size} bytes, more than the {MAX_BYTES} allowed; fix: a profile is "
                    "a short YAML file, check that this is the right file",
                    file=file,
                )
            )
            return None
        raw = path.read_bytes()
    except OSError as e:
        problems.append(
            Problem(
                f"cannot read: {e.strerror}; fix: check the path and its permissions", file=file
            )
        )
        return None
    if b"\x00" in raw:
        problems.append(
            Problem("binary file (NUL bytes); fix: a profile is a UTF-8 YAML text file", file=file)
        )
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        problems.append(
            Problem("not UTF-8 text; fix: save the file as UTF-8", file=file, line=line)
        )
        return None


def _compose(text: str, file: str, problems: list[Problem]) -> tuple[_Loader, Node | None] | None:
    """The document's node tree (with the loader that builds its values), or None with the
    problem: a control character, invalid YAML, nesting too deep."""
    try:
        loader = _Loader(text, file, problems)  # the reader refuses control characters here
    except yaml.YAMLError as err:
        problems.append(
            Problem(
                "contains a control character YAML does not allow; fix: remove it (write plain "
                "text)",
                file=file,
                line=_reader_line(err, text),
            )
        )
        return None
    try:
        return loader, loader.get_single_node()
    except _Stop:
        return None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        what = getattr(e, "problem", None) or str(e)
        problems.append(
            Problem(
                f"not valid YAML: {what}; fix: check the indentation and quoting near this line",
                file=file,
                line=mark.line + 1 if mark else None,
            )
        )
        return None
    finally:
        loader.dispose()


def _reader_line(err: yaml.YAMLError, text: str) -> int | None:
    """The line of the reader's error: its mark, else its character position."""
    mark: object = getattr(err, "problem_mark", None)
    if isinstance(mark, Mark):
        return mark.line + 1
    position: object = getattr(err, "position", None)
    return text[:position].count("\n") + 1 if isinstance(position, int) else None


@mutable
class _Builder:
    """A mapping node's values, every key's line in `lines`, every bad key or value a problem."""

    loader: _Loader
    file: str
    problems: list[Problem]
    lines: dict[Path_, int] = field(default_factory=dict)

    def value(self, node: Node, path: Path_) -> Yaml:
        if isinstance(node, MappingNode):
            return self.mapping(node, path)
        if isinstance(node, SequenceNode):
            return self.sequence(node, path)
        try:
            assert isinstance(node, ScalarNode)  # the composer makes no other node
            return _scalar_value(self.loader, node)
        except _BadScalar as e:
            self._bad(str(e), node.start_mark.line + 1, dotted(path) or None)
            return None

    def mapping(self, node: MappingNode, path: Path_) -> dict[str, Yaml]:
        out: dict[str, Yaml] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            try:
                key = (
                    _scalar_value(self.loader, key_node)
                    if isinstance(key_node, ScalarNode)
                    else None
                )
            except _BadScalar as e:
                self._bad(str(e), line, dotted(path) or None)
                continue
            if not isinstance(key, str):
                self._bad(
                    f"key {key!r} is not text; fix: write keys as plain names",
                    line,
                    dotted(path) or None,
                )
                continue
            if key in out:
                self._bad(
                    f"duplicate key (first on line {self.lines[(*path, key)]}); "
                    "fix: keep one of them",
                    line,
                    dotted((*path, key)),
                )
                continue
            self.lines[(*path, key)] = line
            out[key] = self.value(value_node, (*path, key))
        return out

    def sequence(self, node: SequenceNode, path: Path_) -> list[Yaml]:
        items = []
        for i, item in enumerate(node.value):
            self.lines[(*path, i)] = item.start_mark.line + 1
            items.append(self.value(item, (*path, i)))
        return items

    def name_keys(self, *, first: int) -> None:
        """Give the problems since `first` (and the loader's) the key of their line, the
        deepest key on it."""
        by_line = {n: p for p, n in sorted(self.lines.items(), key=lambda kv: -len(kv[0]))}
        for p in self.problems[first:] + self.loader.problems_of_file(self.file):
            if p.key is None and p.line in by_line:
                p.key = dotted(by_line[p.line])

    def _bad(self, message: str, line: int, key: str | None) -> None:
        self.problems.append(Problem(message, file=self.file, line=line, key=key))


def dotted(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
