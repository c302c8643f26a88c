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
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from yaml.events import AliasEvent, CollectionStartEvent, NodeEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from hpctrain.errors import Problem, UserError, ValidationError
from hpctrain.profiles import cache

if TYPE_CHECKING:
    from hpctrain.profiles.schema import Profile
# pydantic and the schema are imported where used: a cached validation (profiles/cache.py) needs
# neither, which halves the CLI's start-up.

MAX_BYTES = 256 * 1024
MAX_DEPTH = 8
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
    loader = _Loader(text, file, problems)
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
            key = loader.construct_object(key_node) if isinstance(key_node, ScalarNode) else None
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
    return loader.construct_object(node)


def dotted(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# ---------------------------------------------------------------------------------------------
# Trust


def check_trust(path: Path, *, bundled: bool = False) -> None:
    """Refuse a profile that anyone but its owner (or root) could have changed, like ssh.

    A bundled profile is trusted as much as hpctrain's own code: its file mode is checked, and
    it is refused only when it is more writable than the package's code (a checkout made with
    umask 002 is not refused for that)."""
    targets = [path] if bundled else [path, path.parent]
    allowed = 0
    if bundled:
        allowed = Path(__file__).resolve().parent.parent.joinpath("__init__.py").stat().st_mode
    for target in targets:
        try:
            st = target.stat()
        except OSError:
            continue
        what = "directory" if target.is_dir() else "file"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) & ~allowed:
            who = "group" if st.st_mode & stat.S_IWGRP else "world"
            mode = stat.S_IMODE(st.st_mode)
            raise UserError(
                f"Bad permissions {mode:04o} on {what} {target}: it is {who}-writable, so someone "
                f"else could change what runs on the cluster. Refusing profile {path}.\n"
                f"  fix: chmod go-w {target}")
        if st.st_uid not in (0, os.getuid()):
            raise UserError(
                f"Bad owner (uid {st.st_uid}) of {what} {target}: profiles must belong to you or "
                f"root. Refusing profile {path}.\n  fix: chown root {target} (or copy it)")


# ---------------------------------------------------------------------------------------------
# Discovery


@dataclass
class Entry:
    """One profile file found by discovery."""

    name: str
    path: Path
    kind: str                          # "bundled" | "site" | "user"
    shadowed_by: Path | None = None    # the file that wins this name, when not this one

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
    for d in os.environ.get("HPCTRAIN_SITE_PATH", "").split(":"):
        if d:
            dirs.append((Path(d).expanduser(), "site"))
    dirs.append((config_home() / "profiles", "user"))
    return dirs


def discover() -> list[Entry]:
    """Every profile file, in precedence order (lowest first); later wins a name clash."""
    entries: list[Entry] = []
    for d, kind in search_dirs():
        if not d.is_dir():
            continue
        files = sorted(p for p in d.iterdir()
                       if p.suffix in (".yaml", ".yml") and not p.name.startswith(".") and p.is_file())
        entries += [Entry(p.stem, p.resolve(), kind) for p in files]
    winners = {e.name: e.path for e in entries}
    for e in entries:
        if winners[e.name] != e.path:
            e.shadowed_by = winners[e.name]
    return entries


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
    entries = discover()
    for e in reversed(entries):
        if e.name == name and e.path not in (skip or set()):
            return e.path
    names = sorted({e.name for e in entries})
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UserError(f"no profile named {name!r}; {hint}available: {', '.join(names) or 'none'}.\n"
                    "  fix: pass --profile with one of these names or a path to a profile file "
                    "(`hpctrain profiles list` shows where each comes from)")


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
        node = data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return _Layer(data, {}, "command line", "flag")


def _chain(top: Path, problems: list[Problem]) -> list[Doc]:
    """The top file and its ancestors (top first). Cycles and missing parents are problems."""
    docs: list[Doc] = []
    seen: list[Path] = []
    path: Path | None = top.resolve()
    while path is not None:
        if path in seen:
            names = " -> ".join(str(p) for p in [*seen, path])
            problems.append(Problem(f"extends forms a cycle: {names}; fix: break the cycle",
                                    file=str(docs[-1].path), line=docs[-1].lines.get(("extends",)),
                                    key="extends"))
            break
        seen.append(path)
        check_trust(path, bundled=_is_bundled(path))
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
            path = (path.parent / p).resolve() if not p.is_absolute() else p.resolve()
            if not path.is_file():
                problems.append(Problem(f"extends {parent!r}: no such file ({path}); fix: give a "
                                        "path relative to this file, or a profile name",
                                        file=str(doc.path), line=doc.lines.get(("extends",)),
                                        key="extends"))
                break
        else:
            try:
                path = find(parent, skip=set(seen))
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


def _locks_of(doc: Doc) -> list[str]:
    locked = doc.data.get("locked")
    return [k for k in locked if isinstance(k, str)] if isinstance(locked, list) else []


def resolve_file(top: Path, flags: dict[str, object] | None = None, *,
                 user_config: bool = True, expect_name: str | None = None) -> Profile:
    """Resolve the profile in file `top` through every layer; all problems raised together."""
    problems: list[Problem] = []
    docs = _chain(top, problems)
    layers = [_Layer(d.data, d.lines, str(d.path), str(d.path), _locks_of(d)) for d in reversed(docs)]
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
    for layer in layers:
        for path, value in _leaves(layer.data):
            if not path or path == ("locked",):
                continue
            key = dotted(path)
            for locked, by in locks.items():
                if _covers(key, locked) and _get(merged, path) != value:
                    problems.append(Problem(
                        f"{locked} is locked by profile {by}; fix: remove {key} here (ask the "
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
