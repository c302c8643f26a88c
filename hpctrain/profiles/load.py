"""Loading site profiles: safe YAML with line numbers, the `extends` chain, layers, locked keys,
discovery and trust.

Layers, lowest first: the schema's defaults < the `extends` chain (root ancestor first) < the
user's config (`overrides:` in $XDG_CONFIG_HOME/hpctrain/config.yaml) < command-line flags.
Mappings merge key by key; lists and scalars replace; null resets a key to its default.
`locked` keys accumulate down the chain: a child profile, the user config and flags may not
change them (setting the same value is allowed).
"""

from __future__ import annotations

import difflib
import math
import os
import re
import shutil
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent, NodeEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from hpctrain.errors import Problem, UserError, ValidationError
from hpctrain.kernel import jobenv
from hpctrain.profiles import cache
from hpctrain.profiles import locks as _locks
from hpctrain.profiles import trust as _trust

if TYPE_CHECKING:
    from hpctrain.profiles.schema import Profile
# pydantic and the schema are imported where used: a cached validation (profiles/cache.py) needs
# neither, which halves the CLI's start-up.

MAX_BYTES = 256 * 1024
MAX_DEPTH = 8
MAX_INT = 2**63 - 1                    # bash arithmetic and every consumer of a count stop here
NAME_MISSING = "required key is missing; fix: add `name: NAME` (every profile file names itself)"
Path_ = tuple[str | int, ...]          # a key path inside a document: ("slurm", "extra_sbatch", 0)


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

    def construct_yaml_int(self, node: Any) -> Any:
        # YAML 1.1 reads 1:30 as 90 (base 60): keep such a value as the text it looks like
        if ":" in str(node.value):
            return str(node.value)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: Any) -> Any:
        if ":" in str(node.value):
            return str(node.value)
        return super().construct_yaml_float(node)

    def problems_of_file(self, file: str) -> list[Problem]:
        return [p for p in self.problems if p.file == file and p.key is None]

    def _problem(self, event: Any, message: str) -> None:
        self.problems.append(Problem(message, file=self.file, line=event.start_mark.line + 1))

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            self.get_event()
            self._problem(event, f"alias *{event.anchor} is not allowed; fix: write the value out "
                          "(profiles reuse values through `extends`, not YAML anchors)")
            return ScalarNode("tag:yaml.org,2002:null", "", event.start_mark, event.end_mark)
        if isinstance(event, NodeEvent):
            if event.anchor is not None:
                self._problem(event, f"anchor &{event.anchor} is not allowed; fix: remove it "
                              "(profiles reuse values through `extends`, not YAML anchors)")
                event.anchor = None
            if event.tag is not None:
                tag = event.tag.replace("tag:yaml.org,2002:", "!!")
                self._problem(event, f"tag {tag} is not allowed (no tag may construct "
                              "objects); fix: remove the tag and write a plain value")
                event.tag = None
        if isinstance(event, CollectionStartEvent):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                self._problem(event, f"nested deeper than {MAX_DEPTH} levels; fix: profiles are "
                              "at most a few levels deep, check the indentation")
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
        return text                    # control characters: the flags layer reports them
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
        raise _BadScalar("the YAML merge key << is not allowed; fix: write the keys out (profiles "
                         "reuse values through `extends`)")
    try:
        value = loader.construct_object(node)
    except ValueError:     # e.g. more digits than Python converts (int_max_str_digits)
        raise _BadScalar(f"the number {node.value[:20]}... is far too large; fix: write a "
                         "realistic value") from None
    except yaml.YAMLError as e:
        raise _BadScalar(f"cannot read this value ({getattr(e, 'problem', None) or e}); fix: quote it "
                         "as text") from None
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise _BadScalar(f"the number {str(value)[:20]}... is larger than {MAX_INT}; fix: write a "
                         "realistic value")
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
        return ("the text is not valid Unicode (undecodable bytes); fix: write it in UTF-8")
    if any((ord(c) < 32 and c not in "\t\n") or 0x7F <= ord(c) < 0xA0 for c in value):
        return (f"{value[:40]!r} contains a control character; fix: remove it (write plain text)")
    return None


@dataclass
class Doc:
    """One YAML file: its data and the line of every key path."""

    path: Path
    data: dict[str, Any]
    lines: dict[Path_, int]


def read_yaml(path: Path, problems: list[Problem]) -> Doc | None:
    """Load one file safely. Appends every problem found; returns None when nothing usable."""
    file = str(path)

    def fail(message: str, line: int | None = None) -> None:
        problems.append(Problem(message, file=file, line=line))

    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            fail(f"file is {size} bytes, more than the {MAX_BYTES} allowed; fix: a profile is a "
                 "short YAML file, check that this is the right file")
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
    parsed = cache.parsed(text)          # this exact text read before without a problem
    if parsed is not None:
        return Doc(path, *parsed)
    before = len(problems)
    try:
        loader = _Loader(text, file, problems)      # the reader refuses control characters here
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "position", None)
        line = mark.line + 1 if hasattr(mark, "line") else text[: e.position].count("\n") + 1 \
            if isinstance(getattr(e, "position", None), int) else None
        fail("contains a control character YAML does not allow; fix: remove it (write plain text)", line)
        return None
    try:
        node = loader.get_single_node()
    except _Stop:
        return None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        what = getattr(e, "problem", None) or str(e)
        fail(f"not valid YAML: {what}; fix: check the indentation and quoting near this line",
             mark.line + 1 if mark else None)
        return None
    finally:
        loader.dispose()
    if node is None or (isinstance(node, ScalarNode) and node.tag.endswith(":null")):
        fail("empty file; fix: a profile needs at least `name: NAME`")
        return None
    if not isinstance(node, MappingNode):
        fail("the top level is not a mapping; fix: write `key: value` lines, starting with "
             "`name: NAME`", node.start_mark.line + 1)
        return None
    lines: dict[Path_, int] = {}
    first = len(problems)
    data = _build(loader, node, (), lines, file, problems)
    by_line = {n: p for p, n in sorted(lines.items(), key=lambda kv: -len(kv[0]))}
    for p in problems[first:] + loader.problems_of_file(file):
        if p.key is None and p.line in by_line:
            p.key = dotted(by_line[p.line])
    if len(problems) == before:
        cache.store_parsed(text, data, lines)
    return Doc(path, data, lines)


def _build(loader: _Loader, node: Any, path: Path_, lines: dict[Path_, int], file: str,
           problems: list[Problem]) -> Any:
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
                problems.append(Problem(f"key {key!r} is not text; fix: write keys as plain names",
                                        file=file, line=line, key=dotted(path) or None))
                continue
            if key in out:
                problems.append(Problem(f"duplicate key (first on line {lines[(*path, key)]}); "
                                        "fix: keep one of them", file=file, line=line,
                                        key=dotted((*path, key))))
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
        problems.append(Problem(str(e), file=file, line=node.start_mark.line + 1,
                                key=dotted(path) or None))
        return None


def dotted(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# ---------------------------------------------------------------------------------------------
# Trust


def check_trust(path: Path, *, bundled: bool = False) -> Path:
    """Refuse a profile that anyone but its owner (or root) could have changed (trust.py); returns
    the resolved path."""
    return _trust.check_trust(path, what=f"profile {path}", bundled=bundled)


# ---------------------------------------------------------------------------------------------
# Discovery


@dataclass
class Entry:
    """One profile file found by discovery."""

    name: str
    path: Path
    kind: str                          # "bundled" | "site" | "user"
    shadowed_by: Path | None = None    # the file that wins this name, when not this one
    found: Path | None = None          # the path as found (the trust check follows it, symlinks too)
    error: str | None = None           # a search folder that cannot be read: one broken row

    @property
    def wins(self) -> bool:
        return self.shadowed_by is None


def config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "hpctrain"


def search_dirs() -> list[tuple[Path, str]]:
    """Discovery order, lowest precedence first."""
    from hpctrain.resources import bundled

    dirs: list[tuple[Path, str]] = []
    try:
        dirs.append((bundled("site_configs"), "bundled"))
    except FileNotFoundError:
        pass
    for d in (jobenv.get(jobenv.SITE_PATH) or "").split(":"):
        if d:
            dirs.append((Path(d).expanduser(), "site"))
    dirs.append((config_home() / "profiles", "user"))
    return dirs


def discover() -> list[Entry]:
    """Every profile file, in precedence order (lowest first); later wins a name clash."""
    entries: list[Entry] = []
    broken: list[Entry] = []
    for d, kind in search_dirs():
        try:
            if not d.is_dir():
                continue
            files = sorted(p for p in d.iterdir()
                           if p.suffix in (".yaml", ".yml") and not p.name.startswith(".") and p.is_file())
            found = [Entry(p.stem, p.resolve(), kind, found=Path(os.path.abspath(p))) for p in files]
        except (OSError, RuntimeError) as e:
            reason = getattr(e, "strerror", None) or str(e)
            broken.append(Entry("", d, kind, found=d, error=f"cannot read search folder {d}: {reason}; "
                                f"fix: make it readable or remove it from {jobenv.SITE_PATH}"))
            continue
        stems = [e.name for e in found]
        for e in found:   # NAME.yaml beside NAME.yml: an error, never a silent winner
            if stems.count(e.name) > 1:
                e.error = (f"{e.found}:1: name: both {e.name}.yaml and {e.name}.yml are in {d}; "
                           "fix: delete one of them (hpctrain does not pick one)")
        entries += found
    winners = {e.name: e.path for e in entries if e.error is None}
    for e in entries:
        if e.name in winners and winners[e.name] != e.path:
            e.shadowed_by = winners[e.name]
    return entries + broken


def _is_bundled(path: Path) -> bool:
    from hpctrain.resources import bundled

    try:
        return path.resolve().parent == bundled("site_configs").resolve()
    except FileNotFoundError:
        return False


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
    names = sorted({e.name for e in entries})
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UserError(f"no profile named {name!r}; {hint}available: {', '.join(names) or 'none'}.\n"
                    "  fix: pass --profile with one of these names or a path to a profile file "
                    "(`hpctrain profiles list` shows where each comes from)")


def _check_shadowing(winner: Entry, entries: list[Entry]) -> None:
    """A user's profile may not silently replace a site (or bundled) profile that locks keys: the
    admin's locks would be gone without a word. Refused, with the way to build on it instead."""
    if winner.kind != "user":
        return
    mine = read_yaml(winner.path, [])
    if mine is not None and mine.data.get("extends") == winner.name:
        return      # builds on the site's profile of the same name: its locks still hold
    for e in entries:
        if e.name != winner.name or e.kind == "user" or e.path == winner.path:
            continue
        problems: list[Problem] = []
        doc = read_yaml(e.path, problems)
        locked = doc.data.get("locked") if doc else None
        if locked:
            raise UserError(
                f"your profile {winner.found or winner.path} has the same name as the {e.kind} profile "
                f"{e.path}, which locks {locked}: yours would silently drop those locks. Refusing it.\n"
                f"  fix: rename yours (e.g. {winner.name}-mine.yaml with `name: {winner.name}-mine`) and "
                f"add `extends: {winner.name}` to build on the site's profile")


# ---------------------------------------------------------------------------------------------
# Layers


@dataclass
class _Layer:
    data: dict[str, Any]
    lines: dict[Path_, int]
    file: str | None         # for problems
    origin: str              # prefix for origins: a path, "user config <path>", "flag"
    locks: list[str] = field(default_factory=list)


def _leaves(data: Any, path: Path_ = ()) -> list[tuple[Path_, Any]]:
    if isinstance(data, dict) and data:
        return [leaf for k, v in data.items() for leaf in _leaves(v, (*path, k))]
    return [(path, data)]


def _get(data: Any, path: Path_) -> Any:
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
    model: Any = False                 # looked up at the first null only (no schema otherwise)
    out = {}
    for k, v in data.items():
        if v is None:
            from pydantic_core import PydanticUndefined

            from hpctrain.profiles.schema import model_at

            if model is False:
                model = model_at((*path, ""))
            field = model.model_fields.get(k) if model else None
            if field is not None and (field.default_factory is not None
                                      or field.default not in (None, PydanticUndefined)):
                continue
        out[k] = _drop_nulls(v, (*path, k)) if isinstance(v, dict) else v
    return out


def _covers(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _quoted_instead_of(path: Path_) -> str | None:
    """For a text value at `path`: what the schema wants when that is a bool or a number only
    (`exclusive: 'true'`, `max_nodes: '4'` were accepted although the messages said no quotes)."""
    from hpctrain.profiles.schema import model_at

    model = model_at(path) if path and isinstance(path[-1], str) else None
    field = model.model_fields.get(str(path[-1])) if model else None
    if field is None:
        return None
    types = set(typing.get_args(field.annotation)) or {field.annotation}
    if str in types or not types & {bool, int, float}:
        return None
    return "write true or false" if bool in types else (
        "write a whole number" if int in types else "write a number")


def _quoted_wants(data: dict[str, Any]) -> list[str | None]:
    return [_quoted_instead_of(tuple(p)) for p in data["paths"]]


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
            problems.append(Problem(f"unknown key; {hint} (the user config holds default_profile "
                                    "and overrides)", file=str(path), line=doc.lines[(key,)], key=key))
    if default is not None and not isinstance(default, str):
        problems.append(Problem("not a profile name; fix: write `default_profile: NAME`",
                                file=str(path), line=doc.lines[("default_profile",)],
                                key="default_profile"))
        default = None
    if not isinstance(overrides, dict):
        problems.append(Problem("not a mapping; fix: write profile keys under `overrides:`, e.g. "
                                "`slurm: {account: myproj}`", file=str(path),
                                line=doc.lines[("overrides",)], key="overrides"))
        return default, None
    for key in ("name", "extends", "locked"):
        if key in overrides:
            problems.append(Problem(f"{key} cannot be overridden; fix: remove it from overrides",
                                    file=str(path), line=doc.lines[("overrides", key)],
                                    key=f"overrides.{key}"))
            overrides = {k: v for k, v in overrides.items() if k != key}
    lines = {p[1:]: n for p, n in doc.lines.items() if p[:1] == ("overrides",)}
    return default, _Layer(overrides, lines, str(path), f"user config {path}")


def _flags_layer(flags: dict[str, object], problems: list[Problem]) -> _Layer:
    data: dict[str, Any] = {}
    for key, value in flags.items():
        parts = key.split(".")
        if parts[0] in ("name", "extends", "locked"):
            problems.append(Problem(f"{parts[0]} cannot be set from the command line",
                                    file="command line", key=key))
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
        problems.append(Problem(f"{key} sets a key under a value that is not a section; fix: set "
                                "one of them", file="command line", key=key))
    return _Layer(data, {}, "command line", "flag")


def _bad_flag_value(value: object) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int) and abs(value) > MAX_INT or (
            isinstance(value, str) and re.fullmatch(r"[-+]?[0-9_]{19,}", value)):
        return f"the number {str(value)[:20]}... is far too large; fix: write a realistic value"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number; fix: write a plain number"
    return _bad_text(value) if isinstance(value, str) else None


def _chain(top: Path, problems: list[Problem]) -> list[Doc]:
    """The top file and its ancestors (top first). Cycles and missing parents are problems."""
    docs: list[Doc] = []
    seen: list[Path] = []
    literal: Path | None = top
    while literal is not None:
        path = _trust_or_resolve(literal)
        if path in seen:
            names = " -> ".join(str(p) for p in [*seen, path])
            problems.append(Problem(f"extends forms a cycle: {names}; fix: break the cycle",
                                    file=str(docs[-1].path), line=docs[-1].lines.get(("extends",)),
                                    key="extends"))
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
            break                      # the schema reports the wrong type
        if _looks_like_path(parent):
            p = Path(parent).expanduser()
            literal = Path(os.path.abspath(path.parent / p))
            if not literal.is_file():
                problems.append(Problem(f"extends {parent!r}: no such file ({literal}); fix: give a "
                                        "path relative to this file, or a profile name",
                                        file=str(doc.path), line=doc.lines.get(("extends",)),
                                        key="extends"))
                break
        else:
            try:
                literal = find(parent, skip=set(seen))
            except UserError:
                others = [e.path for e in discover() if e.name == parent]
                if others and all(p in seen for p in others):
                    names = " -> ".join(str(p) for p in [*seen, others[-1]])
                    msg = f"extends forms a cycle: {names}; fix: break the cycle"
                else:
                    names = sorted({e.name for e in discover()})
                    close = difflib.get_close_matches(parent, names, n=1)
                    hint = f"did you mean {close[0]!r}? " if close else ""
                    msg = (f"extends {parent!r}: no such profile; {hint}fix: use one of "
                           f"{', '.join(names)} or a path")
                problems.append(Problem(msg, file=str(doc.path), line=doc.lines.get(("extends",)),
                                        key="extends"))
                break
    return docs


def _trust_or_resolve(path: Path) -> Path:
    try:
        return path.resolve(strict=True)
    except (OSError, RuntimeError):
        check_trust(path)           # raises with the reason (missing, a symlink loop, ...)
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
        problems.append(Problem(f"locked is {kind} ({str(locked)[:60]!r}), not a list; {example}",
                                file=file, line=doc.lines.get(("locked",)), key="locked"))
        return []
    out = []
    keys = [k for k in locked if isinstance(k, str)]
    unknown = set(cache.memo("unknown_lock_keys", {"keys": keys}, _unknown_keys)) if keys else set()
    for i, key in enumerate(locked):
        line = doc.lines.get(("locked", i), doc.lines.get(("locked",)))
        if not isinstance(key, str):
            problems.append(Problem(f"{key!r} is not a dotted key; {example}", file=file, line=line,
                                    key=f"locked[{i}]"))
        elif key.split(".")[0] in ("name", "extends", "locked"):
            problems.append(Problem(f"{key!r} cannot be locked; fix: remove it from locked", file=file,
                                    line=line, key=f"locked[{i}]"))
        elif key in unknown:
            problems.append(Problem(f"locked key {key!r} is not a profile key; fix: use dotted keys "
                                    "such as 'slurm.account' or a section such as 'network'",
                                    file=file, line=line, key=f"locked[{i}]"))
        else:
            out.append(key)
    return out


def _unknown_keys(data: dict[str, Any]) -> list[str]:
    from hpctrain.profiles.schema import key_exists

    return [k for k in data["keys"] if not key_exists(k)]


def resolve_file(top: Path, flags: dict[str, object] | None = None, *,
                 user_config: bool = True, expect_name: str | None = None) -> Profile:
    """Resolve the profile in file `top` through every layer; all problems raised together."""
    problems: list[Problem] = []
    docs = _chain(top, problems)
    layers = [_Layer(d.data, d.lines, str(d.path), str(d.path), _locks_of(d, problems))
              for d in reversed(docs)]
    if docs and expect_name is not None and docs[0].data.get("name") not in (None, expect_name):
        problems.append(Problem(f"name {docs[0].data['name']!r} does not match the file name "
                                f"{expect_name!r}; fix: rename the file to "
                                f"{docs[0].data['name']}.yaml or change name", file=str(docs[0].path),
                                line=docs[0].lines.get(("name",)), key="name"))
    if user_config:
        _, layer = _user_config(problems)
        if layer is not None:
            layers.append(layer)
    if flags:
        layers.append(_flags_layer(flags, problems))

    merged: dict[str, Any] = {}
    origins: dict[Path_, str] = {}
    where: dict[Path_, tuple[str | None, int | None]] = {}
    locks: dict[str, str] = {}              # dotted key -> the profile file that locked it
    quoted: list[tuple[Path_, str, _Layer]] = []   # text values where the schema may want bools/numbers
    for layer in layers:
        for path, value in _leaves(layer.data):
            if not path or path == ("locked",):
                continue
            key = dotted(path)
            if layer.origin != "flag" and isinstance(value, str) and all(isinstance(p, str) for p in path):
                quoted.append((path, value, layer))
            locked = _locks.covering_lock(locks, path)
            if locked is not None and _get(merged, path) != value:
                by = locks[locked]
                also = "" if _covers(key, locked) else f" ({key} sets what {locked} covers)"
                problems.append(Problem(
                    f"{locked} is locked by profile {by}{also}; fix: remove {key} here (ask the "
                    "profile's admin if it must change)", file=layer.file,
                    line=layer.lines.get(path), key=key))
        merged = _merge(merged, {k: v for k, v in layer.data.items() if k != "locked"})
        for path, _ in _leaves(layer.data):
            if not path:
                continue
            for old in [p for p in origins if p[: len(path)] == path]:
                del origins[old]
            line = layer.lines.get(path)
            origins[path] = (f"{layer.origin}:{line}" if line else
                             f"flag {dotted(path)}" if layer.origin == "flag" else layer.origin)
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
                problems.append(Problem(f"{value!r} is quoted text; fix: {want} without quotes",
                                        file=layer.file, line=layer.lines.get(path), key=dotted(path)))
    merged = cache.memo("drop_nulls", merged, _drop_nulls)
    merged["locked"] = list(dict.fromkeys(locks))
    if docs:
        for key in ("name", "extends"):          # never inherited
            merged.pop(key, None)
            if docs[0].data.get(key) is not None:
                merged[key] = docs[0].data[key]
        where.setdefault(("locked",), (str(docs[0].path), docs[0].lines.get(("locked",))))

    profile = None
    if docs and not problems:
        profile = cache.lookup(merged)   # the same input validated before: no pydantic
    if docs and profile is None:
        from pydantic import ValidationError as PydanticError

        from hpctrain.profiles.schema import Profile

        try:
            profile = Profile.model_validate(merged)
            if not problems:
                cache.store(merged, profile)
        except PydanticError as e:
            errors = e.errors()
            problems += _problems(errors + _more_cross_field(merged, errors), where, str(docs[0].path))
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


def _more_cross_field(merged: dict[str, Any], errors: list[Any]) -> list[Any]:
    """Cross-field checks of sections whose other keys had errors (pydantic skips them), run
    on the keys that were fine, so that every problem of a file is reported at once."""
    from pydantic import ValidationError as PydanticError

    from hpctrain.profiles.schema import SECTIONS

    out = []
    for name, model in SECTIONS.items():
        bad = {e["loc"][1] for e in errors if e["loc"][:1] == (name,) and len(e["loc"]) > 1}
        section = merged.get(name)
        if not bad or not isinstance(section, dict):
            continue
        try:
            model.model_validate({k: v for k, v in section.items() if k not in bad})
        except PydanticError as e:
            out += [{**err, "loc": (name, *err["loc"])} for err in e.errors()
                    if err["type"] == "cross_field"]
    return out


def _problems(errors: list[Any], where: dict[Path_, tuple[str | None, int | None]],
              top: str) -> list[Problem]:
    out = []
    for err in errors:
        loc = tuple(p for p in err["loc"] if p != "[key]")
        items = [(loc, err["msg"])]
        if err["type"] == "cross_field":
            items = [((*loc, f), m) for f, m in err["ctx"]["items"]]
        for path, msg in items:
            file, line = top, None
            for n in range(len(path), -1, -1):
                if path[:n] in where:
                    file, line = where[path[:n]]
                    break
            out.append(Problem(_message(err, path, msg), file=file, line=line, key=dotted(path)))
    return out


def _message(err: Any, path: Path_, msg: str) -> str:
    from hpctrain.profiles.schema import model_at

    kind = err["type"]
    if kind == "extra_forbidden":
        model = model_at(path)
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
    shown = f" (got {got!r})" if isinstance(got, str | int | float | bool) else ""
    if kind == "missing":
        return NAME_MISSING if path == ("name",) else "required key is missing; fix: add it"
    return f"{msg}{shown}; fix: {_FIX.get(kind, 'see docs/site-profiles.md')}"


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
    raise UserError("no profile given and this machine has Slurm; fix: pass --profile NAME "
                    f"(available: {', '.join(names)}) or set `default_profile: NAME` in "
                    f"{config_home() / 'config.yaml'}")


def resolve(name_or_path: str | None = None, flags: dict[str, object] | None = None) -> Profile:
    """The fully validated, merged profile for a name (discovery) or a file path.

    With no name: the user config's `default_profile`, else `local` when `sbatch` is not on
    PATH, else an error listing the available names.
    """
    ref = name_or_path if name_or_path is not None else default_profile_name()
    path = Path(ref).expanduser()
    if _looks_like_path(ref) or (path.is_file() and not any(e.name == ref for e in discover())):
        if not path.is_file():
            raise UserError(f"profile file {ref} does not exist; fix: check the path, or give a "
                            "profile name (`hpctrain profiles list`)")
        return resolve_file(path, flags)
    return resolve_file(find(ref), flags, expect_name=ref)
