"""Reading checkpoint files without running code from them (issue 33).

A checkpoint folder is input that another account may have written: a shared run folder, a folder
handed to `hpctrain export`. Its manifest's digests are no signature (whoever writes the files
writes the digests), so nothing in one goes through the full unpickler unless only this user could
have written it:
  - DCP's `.metadata` (`load_metadata`): an Unpickler that builds only the classes DCP's metadata
    holds (compat.dcp_metadata_globals); any other global is one line, refused;
  - torch files (`load_torch`: a runtime `state.pt`, DeepSpeed's `*.pt`) and DCP's pickled
    non-tensor items (`safe_bytes`): torch.load(weights_only=True), anything more refused;
  - a peer format that needs the full unpickler, DeepSpeed's (its optimizer files hold its own
    classes, and its load_checkpoint and zero_to_fp32 always unpickle fully): `private` refuses
    it unless this user (or root) owns every file and folder up to the run folder and nobody else
    can write them (hpctrain.kernel.checkpoint.not_private); `load_torch(path, root=RUN)` for one
    such file.
Every refusal is a UserError: one line, exit 2.
"""

from __future__ import annotations

import contextlib
import enum
import io
import pickle
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import IO

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)

from hpctrain.kernel.checkpoint import not_private
from hpctrain.kernel.errors import UserError
from train_entry.compat import dcp_metadata_globals

_allowed = cache(dcp_metadata_globals)


class _Refused(Exception):
    """A global outside the allow-list (its dotted name)."""


def _member(cls: object, name: object) -> enum.Enum:
    """getattr(cls, name) for one case only: Python 3.11.0-3.11.4 pickle an Enum member so (the
    metadata's memory format). Any other getattr could walk from an allowed class to os.system."""
    if (
        isinstance(cls, type)
        and issubclass(cls, enum.Enum)
        and cls in _allowed().values()
        and isinstance(name, str)
        and name in cls.__members__
    ):
        return cls[name]
    raise _Refused(f"builtins.getattr of {getattr(cls, '__name__', type(cls).__name__)}")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:  # a class or function
        if (module, name) == ("builtins", "getattr"):
            return _member
        found = _allowed().get((module, name))
        if found is None:
            raise _Refused(f"{module}.{name}")
        return found


def load_metadata(path: Path) -> Metadata:
    """DCP's Metadata from a `.metadata` file, built by the restricted unpickler."""
    with open(path, "rb") as f:
        return metadata_from(f, path)


def metadata_from(f: IO[bytes], path: Path) -> Metadata:
    refuse = f"{path} is not a DCP checkpoint's metadata ({{}}): refusing to load it"
    try:
        md = _MetadataUnpickler(f).load()
    except _Refused as exc:
        raise UserError(refuse.format(f"it names {exc}")) from None
    except Exception as exc:  # noqa: BLE001 - whatever broken bytes raise, the file is not one
        raise UserError(refuse.format(_why(exc))) from None
    why = _malformed(md)
    if why:
        raise UserError(refuse.format(why))
    return md  # type: ignore[no-any-return]  # checked by _malformed


def _malformed(md: object) -> str | None:
    """What the readers would trip over: a field of another type."""
    if not isinstance(md, Metadata):
        return f"it holds a {type(md).__name__}, not DCP's Metadata"
    entries = md.state_dict_metadata
    if not isinstance(entries, dict) or not isinstance(md.storage_data, dict | None):
        return "its entries are not mappings"
    for key, meta in entries.items():
        if not isinstance(key, str):
            return f"it names an entry by a {type(key).__name__}"
        if isinstance(meta, BytesStorageMetadata):
            continue
        if not (
            isinstance(meta, TensorStorageMetadata)
            and isinstance(meta.size, torch.Size)
            and isinstance(meta.properties, TensorProperties)
            and isinstance(meta.properties.dtype, torch.dtype)
            and isinstance(meta.chunks, list)
        ):
            return f"its entry {str(key)[:80]!r} is not a tensor's or bytes' description"
    return None


def _why(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _global(exc: BaseException) -> str | None:
    """The global torch's weights-only unpickler refused, from its message."""
    found = re.search(r"GLOBAL ([\w.]+)", str(exc))
    return found.group(1) if found else None


def load_torch(path: Path, root: Path | None = None) -> object:
    """A torch file's content, loaded weights-only (tensors, containers, numbers, strings). When
    it holds anything else: refused; with `root` (the run folder, for DeepSpeed's files only) the
    full unpickler instead, if nobody but this user could have written them (`private`)."""
    try:
        with open(path, "rb") as f:
            return _weights_only(f, str(path))
    except UserError:
        if root is None:
            raise
    private(path.parent, root)
    # DeepSpeed's format holds its classes (the loss scaler, ZeroStageEnum) and DeepSpeed loads
    # it so; the files are this user's own, checked just above
    return torch.load(path, map_location="cpu", weights_only=False)


def _weights_only(f: IO[bytes], what: str) -> object:
    try:
        return torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        name = _global(exc)
        held = f"it holds {name}" if name else _why(exc).split(". ")[0]
        raise UserError(
            f"{what}: {held}, which a weights-only load refuses (it could run code): refusing "
            "to load it; save tensors, containers, numbers and strings only"
        ) from None
    except Exception as exc:  # noqa: BLE001 - a damaged archive raises many kinds
        raise UserError(f"{what} is not a torch file hpctrain can read ({_why(exc)})") from None


def safe_bytes(data: bytes, what: str) -> io.BytesIO:
    """A DCP bytes item (DCP's planner unpickles it fully): loaded weights-only, saved again, so
    the planner unpickles only what a weights-only load built."""
    obj = _weights_only(io.BytesIO(data), what)
    out = io.BytesIO()
    torch.save(obj, out)
    out.seek(0)
    return out


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """Around a DCP load: DCP wraps what its reader raised in a CheckpointException (per rank, with
    tracebacks); a refusal comes out as itself, one line."""
    try:
        yield
    except CheckpointException as exc:
        for failure in exc.failures.values():
            inner = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(inner, UserError):
                raise inner from None
        raise


def private(folder: Path, root: Path) -> None:
    """Refuse a folder another account could have written into (files, folders up to `root`)."""
    why = not_private(folder, root)
    if why is not None:
        raise unpickle_refused(why)


def unpickle_refused(why: str) -> UserError:
    """The one line for a folder `not_private` refuses, `why` being its reason."""
    return UserError(
        f"{why}: hpctrain loads this checkpoint's files with the full unpickler (they hold "
        "more than tensors), which runs whatever they say, so only files nobody else could "
        "have written; fix: chmod -R go-w the run folder if it is yours, or copy the "
        "checkpoint into a folder of your own if you trust its author"
    )
