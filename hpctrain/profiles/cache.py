"""A cache of validated profiles, so that the common CLI path never imports pydantic.

Building the profile schema's pydantic classes costs more at start-up than jinja2, yaml and click
together (about 70 ms of a 190 ms `submit --dry-run`). The YAML reading, trust checks, `extends`
chain, layers and locks still run every time (they are cheap); only the final
`Profile.model_validate(merged)` is cached:

- the key is a sha256 of the merged, layered input (plain JSON types only; anything else is not
  cached) and of the schema's source (every `.py` under hpctrain/profiles/: its size and
  modification time) and pydantic's version file, so a schema change or a pydantic upgrade
  misses;
- the value is what the validation produced, as plain data: every field of every section, the
  values of the sections' properties (e.g. `network.gloo_ifname`, `warnings`), `model_dump()` in
  both modes;
- a hit returns a `ProfileView` with the same attributes. Anything the view does not hold (a
  method, a property that could not be stored, `model_dump` with other arguments) falls back to
  validating the same input with pydantic, once, and answers from the real Profile: a view is never
  wrong, at worst it is not faster.

Cache files live in $XDG_CACHE_HOME/hpctrain/profiles/ (default ~/.cache), mode 0600 in a 0700
folder; a file or folder not owned by this user, or writable by others, is ignored. Writing the
cache is not writing a run folder: `submit --dry-run` still writes nothing there.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, cast

from hpctrain.kernel.yamlsafe import Path_, Yaml
from hpctrain.profiles import schema

if TYPE_CHECKING:
    from pydantic import BaseModel

    from hpctrain.profiles.schema.profile import Profile

FORMAT = 1
MAX_ENTRIES = 256
ENABLED = True  # tests switch it off to compare with the uncached path
_FINGERPRINT: str | None = None
# attributes every model has that the cache never stores (pydantic's, or set by the loader)
_SKIP_PROPS = {"origins", "source", "chain", "model_extra", "model_fields_set", "__fields_set__"}
T = TypeVar("T")
D = TypeVar("D", bound=Mapping[str, object])


class _Tree(TypedDict):
    """One model as the cache holds it: its fields, and the values of its properties."""

    fields: dict[str, _Field]
    props: dict[str, object]


class _Field(TypedDict, total=False):
    """One field: a nested model, a list of them, or a plain value."""

    model: _Tree
    models: list[_Tree]
    value: object


class _Entry(TypedDict, total=False):
    """One cache file (JSON): its format and key, then what it holds."""

    format: int
    key: str
    value: object  # remember, memo: a function's plain result
    data: dict[str, Yaml]  # parsed: a profile text read without a problem ...
    lines: list[list[list[str | int] | int]]  # ... and its keys' lines: [path, line] arrays
    tree: _Tree  # store: a validated profile ...
    dump: dict[str, object]  # ... its model_dump() ...
    dump_json: dict[str, object]  # ... and model_dump(mode="json")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpctrain" / "profiles"


def _fingerprint() -> str:
    """The schema's identity: its source files (each one's path, size and modification time: a
    change to one changes its time; reading and hashing them all cost more than the rest of a
    cache hit) and the installed pydantic."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        h = hashlib.sha256(f"format {FORMAT}\n".encode())
        here = os.path.dirname(os.path.realpath(__file__))
        for folder, subdirs, files in os.walk(here):
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
            for name in sorted(f for f in files if f.endswith(".py")):
                st = os.stat(os.path.join(folder, name))
                where = os.path.relpath(os.path.join(folder, name), here)
                h.update(f"{where}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())

        spec = importlib.util.find_spec("pydantic")
        origin = spec.origin if spec else None
        if origin:
            version = Path(origin).with_name("version.py")
            h.update(version.read_bytes() if version.is_file() else origin.encode())
        _FINGERPRINT = h.hexdigest()
    return _FINGERPRINT


def _plain(obj: object) -> bool:
    """Only plain JSON data is cached (str keys; str, int, float, bool, None, list, dict)."""
    if obj is None or type(obj) in (str, int, float, bool):
        return True
    if type(obj) is list:
        return all(_plain(v) for v in obj)
    if type(obj) is dict:
        return all(type(k) is str and _plain(v) for k, v in obj.items())
    return False


def key_of(merged: Mapping[str, object], sources: tuple[Path, ...] = ()) -> str | None:
    if not ENABLED or not _plain(merged):
        return None
    text = json.dumps(merged, sort_keys=True, separators=(",", ":"), allow_nan=True)
    extra = "".join(_source_digest(p) for p in sources)
    return hashlib.sha256(f"{_fingerprint()}{extra}\n{text}".encode()).hexdigest()


_SOURCES: dict[Path, str] = {}


def _source_digest(path: Path) -> str:
    if path not in _SOURCES:
        _SOURCES[path] = hashlib.sha256(path.read_bytes()).hexdigest()
    return _SOURCES[path]


def recall(kind: str, data: Mapping[str, object], sources: tuple[Path, ...] = ()) -> object:
    """A value `remember`ed for the same kind, data and source files, else None."""
    try:
        key = key_of({"memo": kind, "data": data}, sources)
    except OSError:
        return None
    entry = _read(key) if key is not None else None
    return entry.get("value") if entry is not None else None


def remember(
    kind: str, data: Mapping[str, object], value: object, sources: tuple[Path, ...] = ()
) -> None:
    """Remember a pure function's plain result: only for inputs that are the whole input (the
    data and the listed source files, plus the schema's fingerprint)."""
    try:
        key = key_of({"memo": kind, "data": data}, sources)
    except OSError:
        return
    if key is not None:
        _write(key, {"value": value})


def memo(kind: str, data: D, fn: Callable[[D], T]) -> T:
    """fn(data), remembered by the same key rules: for pure functions of plain data and the schema
    (the loader's null-dropping, which asks the schema for defaults). Only a plain JSON result is
    remembered, and it reads back as the same types."""
    key = key_of({"memo": kind, "data": data})
    if key is not None:
        entry = _read(key)
        if entry is not None and "value" in entry:
            return cast(T, entry["value"])  # fn's own result, read back from JSON
    value = fn(data)
    if key is not None:
        _write(key, {"value": value})
    return value


def parsed(text: str) -> tuple[dict[str, Yaml], dict[Path_, int]] | None:
    """(data, lines) of a profile text the loader read before without a problem."""
    key = key_of({"yaml": text})
    entry = _read(key) if key is not None else None
    if entry is None or "data" not in entry:
        return None
    pairs = entry["lines"]
    return entry["data"], {
        tuple(p): n for p, n in pairs if isinstance(p, list) and isinstance(n, int)
    }


def store_parsed(text: str, data: dict[str, Yaml], lines: dict[Path_, int]) -> None:
    key = key_of({"yaml": text})
    if key is not None and _plain(data):
        _write(key, {"data": data, "lines": [[list(p), n] for p, n in lines.items()]})


def _read(key: str) -> _Entry | None:
    folder = cache_dir()
    path = folder / f"{key}.json"
    if not (_trusted(folder) and _trusted(path)):
        return None
    try:
        entry: _Entry = json.loads(path.read_text())  # checked below: ours, this format and key
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or entry.get("key") != key:
        return None
    return entry


def _write(key: str, what: _Entry) -> None:
    entry: _Entry = {"format": FORMAT, "key": key, **what}
    if not _plain(entry):
        return
    try:
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not _trusted(folder):
            return
        tmp = folder / f".{key}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, separators=(",", ":"))
        os.replace(tmp, folder / f"{key}.json")
        _prune(folder)
    except (OSError, TypeError, ValueError):
        return


def _trusted(path: Path) -> bool:
    """Ours and not writable by group or others (a cache is input too)."""
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def lookup(merged: Mapping[str, object]) -> ProfileView | None:
    key = key_of(merged)
    entry = _read(key) if key is not None else None
    if entry is None or "tree" not in entry:
        return None
    return ProfileView(entry, merged)


def store(merged: Mapping[str, object], profile: Profile) -> None:
    """Remember a successful validation. Never fails the command: a cache that cannot be
    written is only a slower next start."""
    key = key_of(merged)
    if key is None:
        return
    try:
        entry: _Entry = {
            "tree": _encode(profile),
            "dump": profile.model_dump(),
            "dump_json": profile.model_dump(mode="json"),
        }
    except (TypeError, ValueError):
        return
    _write(key, entry)


def _prune(folder: Path) -> None:
    entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime)
    for old in entries[:-MAX_ENTRIES]:
        old.unlink(missing_ok=True)


def _encode(model: BaseModel) -> _Tree:
    """A model as {"fields": {name: value or nested}, "props": {name: value}}."""
    fields: dict[str, _Field] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, schema.BaseModel):
            fields[name] = {"model": _encode(value)}
        elif isinstance(value, list) and any(isinstance(v, schema.BaseModel) for v in value):
            fields[name] = {"models": [_encode(v) for v in value]}
        else:
            dumped = type(model).__pydantic_serializer__.to_python(model, include={name})[name]
            fields[name] = {"value": dumped}
    props: dict[str, object] = {}
    for klass in type(model).__mro__:
        if klass is schema.BaseModel or klass.__module__.startswith("pydantic"):
            break
        for name, attr in vars(klass).items():
            if (
                isinstance(attr, property)
                and not name.startswith("_")
                and name not in _SKIP_PROPS
                and name not in props
            ):
                try:
                    value = getattr(model, name)
                except Exception:  # noqa: BLE001 - not stored; the view falls back for it
                    continue
                if _plain(value):
                    props[name] = value
    return {"fields": fields, "props": props}


def _copy(value: T) -> T:
    """A plain value's own copy (the cache's values are JSON: they copy as the same types)."""
    if isinstance(value, dict | list):
        copied: T = json.loads(json.dumps(value))
        return copied
    return value


class _Node:
    """One model of a cached profile: its fields and properties as attributes."""

    def __init__(self, tree: _Tree, root: ProfileView | None, path: Path_) -> None:
        object.__setattr__(self, "_tree", tree)
        object.__setattr__(self, "_root", root if root is not None else self)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_values", {})

    # Any: a cached profile answers every attribute its model has (hpctrain/profiles/resolved.py)
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        values = self._values
        if name in values:
            return values[name]
        field = self._tree["fields"].get(name)
        if field is not None:
            value: object
            if "model" in field:
                value = _Node(field["model"], self._root, (*self._path, name))
            elif "models" in field:
                value = [
                    _Node(t, self._root, (*self._path, name, i))
                    for i, t in enumerate(field["models"])
                ]
            else:
                value = _copy(field["value"])
            values[name] = value
            return value
        if name in self._tree["props"]:
            return _copy(self._tree["props"][name])
        return getattr(self._real_node(), name)

    def __setattr__(self, name: str, value: object) -> None:
        if name in self._tree["fields"]:
            raise AttributeError(f"a cached profile is read-only ({name})")
        object.__setattr__(self, name, value)

    @property  # type: ignore[misc]  # the view answers isinstance() as the model does
    def __class__(self) -> type:
        """`isinstance(view, Profile)` (or a section's class) holds, as for the validated model.
        Whoever holds the class has imported the schema; until then the view is its own class
        (so the fast path stays free of pydantic), and the type itself never changes."""
        models = sys.modules.get("hpctrain.profiles.schema.profile")  # the models, not checks.py
        if models is None:
            return type(self)
        model = models.Profile
        for part in self._path:
            if not isinstance(part, int):
                model = models._model_of(model.model_fields[part].annotation)
        return model or type(self)

    def _real_node(self) -> BaseModel:
        node: object = self._root.real()
        for part in self._path:
            if isinstance(part, str):
                node = getattr(node, part)
            elif isinstance(node, list):
                node = node[part]
        assert isinstance(node, schema.BaseModel)  # a section, or one of a list of them
        return node

    # Any: pydantic's model_dump keywords, passed through
    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        if not kwargs or kwargs == {"mode": "python"}:
            return {
                k: v.model_dump()
                if isinstance(v, _Node)
                else [x.model_dump() for x in v]
                if isinstance(v, list) and v and isinstance(v[0], _Node)
                else _copy(v)
                for k, v in ((n, getattr(self, n)) for n in self._tree["fields"])
            }
        out: dict[str, Any] = self._real_node().model_dump(**kwargs)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({'.'.join(map(str, self._path)) or 'profile'})"


class ProfileView(_Node):
    """A resolved profile read from the cache; answers like `schema.Profile`."""

    def __init__(self, entry: _Entry, merged: Mapping[str, object]) -> None:
        super().__init__(entry["tree"], None, ())
        object.__setattr__(self, "_entry", entry)
        object.__setattr__(self, "_merged", merged)
        object.__setattr__(self, "_real", None)
        object.__setattr__(self, "_source", None)
        object.__setattr__(self, "_chain", [])
        object.__setattr__(self, "_origins", {})

    def real(self) -> Profile:
        """The same profile validated by pydantic (only when the view lacks something)."""
        if self._real is None:
            real = schema.Profile.model_validate(self._merged)
            real._source, real._chain, real._origins = self._source, self._chain, self._origins
            object.__setattr__(self, "_real", real)
        validated: Profile = self._real
        return validated

    # Any: pydantic's model_dump keywords, passed through
    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        out: dict[str, Any]
        if not kwargs or kwargs == {"mode": "python"}:
            out = _copy(self._entry["dump"])
        elif kwargs == {"mode": "json"}:
            out = _copy(self._entry["dump_json"])
        else:
            out = self.real().model_dump(**kwargs)
        return out

    @property
    def origins(self) -> dict[str, str]:
        origins: dict[str, str] = self._origins
        return origins

    @property
    def source(self) -> Path | None:
        source: Path | None = self._source
        return source

    @property
    def chain(self) -> list[Path]:
        chain: list[Path] = self._chain
        return chain
