"""Every private or version-dependent torch name hpctrain uses, in this one module.

torch's checkpoint internals move between releases (2.8 has no `CURRENT_DCP_VERSION`, which once
made every save of a run fail), and a site runs the torch of its module or container, anywhere in
hpctrain.kernel.support.TORCH. So the rest of hpctrain and train_entry import such names only from
here (tests/test_support.py fails on a private torch import anywhere else), and each one below has
a version gate or a public fallback where torch offers one. The compatibility lane
(`make test-compat`) runs the checkpoint tests under the oldest supported torch.

    TORCH             this torch's release, e.g. (2, 8, 0)
    WriterBase        the DCP StorageWriter to subclass (the public FileSystemWriter)
    dcp_save, dcp_load, DefaultSavePlanner, FileSystemReader   DCP's public API, from the modules
                      that define it (torch.distributed.checkpoint re-exports them without
                      `__all__`, so mypy --strict reads them as not exported)
    storage_info      where one item lies in a file (DCP's private _StorageInfo)
    DCP_VERSION       the metadata format version to stamp (None where torch has none: <= 2.8)
    local_tensor      a DTensor's local shard (its private _local_tensor), or the tensor itself
    copy_state_dict / cpu_state_dict   staging copies (torch.distributed._state_dict_utils)
    load_everything   a whole checkpoint into an empty dict, without a process group
    dcp_metadata_globals  every global a DCP `.metadata` pickle may name (checkpoint/safeload.py)
    GLOO_DESTROY_HANGS  gloo's destroy_process_group may hang a rank at the end (every version)
    local_shape_and_offset  a DTensor's local shard shape and its offset in the whole tensor
                      (torch's private compute_local_shape_and_global_offset: 2.7 to 2.14 have it)
"""

from __future__ import annotations

import pathlib
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint import filesystem, state_dict_loader, state_dict_saver
from torch.distributed.checkpoint import metadata as md
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner as DefaultSavePlanner
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader as FileSystemReader
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
from torch.distributed.checkpoint.storage import StorageReader
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from hpctrain.kernel.support import release

if TYPE_CHECKING:
    from torch.distributed.checkpoint.filesystem import _StorageInfo

TORCH = release(torch.__version__)

# After the last collective, gloo's destroy_process_group hung one rank: torch 2.7.1 in 2 of 4
# two-rank runs (and a resumed DeepSpeed run in the compatibility lane), torch 2.13 once in a
# two-rank 8-step run (240 s, 2026-12-02, after rank 0 had written everything). Not version-gated
# any more: the exit closes a gloo group's connections.
GLOO_DESTROY_HANGS = True

# DCP's public writer; train_entry.checkpoint.writer.HashingWriter overrides its write_data/finish.
# (Its private base _FileSystemWriter would do the same, and is not needed.)
WriterBase = FileSystemWriter

# DCP's public save and load, which torch.distributed.checkpoint re-exports without `__all__`.
dcp_save = state_dict_saver.save  # torch.distributed.checkpoint.save
dcp_load = state_dict_loader.load  # torch.distributed.checkpoint.load


def storage_info(relative_path: str, offset: int, length: int) -> _StorageInfo:
    """DCP's record of where one item lies (file, offset, length): FileSystemReader reads it from
    the metadata's storage_data. A private dataclass in every release (2.7 .. 2.14), same fields."""
    # lazy: a torch that moved this private name fails each save with the ImportError, so the run
    # ends at its first save naming it (tests/test_compat.py), not at every start
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    return _StorageInfo(relative_path, offset, length)


def _dcp_version() -> str | None:
    try:  # 2.9 and later stamp the metadata with the format's version
        # lazy: a version gate (2.7 and 2.8 have no CURRENT_DCP_VERSION)
        from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
    except ImportError:  # 2.7, 2.8: no version field is written (their Metadata may lack it)
        return None
    return str(CURRENT_DCP_VERSION)


DCP_VERSION = _dcp_version()


def stamp(metadata: md.Metadata) -> None:
    """Set the metadata's format version as this torch's own writer would (nothing on <= 2.8)."""
    if DCP_VERSION is not None:
        metadata.version = DCP_VERSION


def local_shape_and_offset(t: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A DTensor's local shard: its shape and its offset in the whole tensor (no public API)."""
    # Any: a DTensor (its mesh and placements); typed loosely so callers need not import it
    d: Any = t
    shape, offset = compute_local_shape_and_global_offset(d.shape, d.device_mesh, d.placements)
    return tuple(shape), tuple(offset)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard without autograd (to_local() records a node), else `t` itself."""
    local: torch.Tensor = getattr(t, "_local_tensor", t)
    return local


def copy_state_dict(
    src: dict[str, object], dst: dict[str, object], *, non_blocking: bool = False
) -> None:
    """Copy every tensor of `src` into the tensor at the same place of `dst` (same structure)."""
    _copy_state_dict(src, dst, non_blocking=non_blocking, type_check=False)


def cpu_state_dict(sd: dict[str, object], *, pin_memory: bool = False) -> dict[str, object]:
    """The same structure with new CPU tensors (pinned when asked), for staging copies."""
    return _create_cpu_state_dict(sd, pin_memory=pin_memory)


def load_everything(reader: StorageReader) -> dict[str, object]:
    """The whole state dict a StorageReader holds, on CPU, without a process group (what torch's
    dcp_to_torch_save does; its planner and loader are private)."""
    sd: dict[str, object] = {}
    _load_state_dict(sd, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)  # type: ignore[no-untyped-call]
    return sd


def dcp_metadata_globals() -> dict[tuple[str, str], object]:
    """(module, name) -> object for every global a DCP `.metadata` pickle names: listed from real
    files (this project's writer and DCP's own FileSystemWriter, torch 2.7-2.13, every dtype,
    bytes items, meshes) with a recording Unpickler. Three are private, hence here; a name this
    torch lacks is left out (such a file cannot load here anyway)."""
    found: dict[tuple[str, str], object] = {
        ("torch", name): v for name, v in vars(torch).items() if isinstance(v, torch.dtype)
    }
    found[("torch", "Size")] = torch.Size
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",  # TensorProperties' memory format, an Enum
    ):
        if hasattr(md, name):
            found[(md.__name__, name)] = getattr(md, name)
    for module, name in (
        (filesystem, "_StorageInfo"),  # storage_data: (file, offset, length) of each item
        (torch.serialization, "_get_layout"),  # a torch.layout from its name ("torch.strided")
    ):
        if hasattr(module, name):
            found[(module.__name__, name)] = getattr(module, name)
    # DCP's own writer keeps a Path in StorageMeta; Python 3.13 names it pathlib._local.PosixPath
    found[("pathlib", "PosixPath")] = found[("pathlib._local", "PosixPath")] = pathlib.PosixPath
    return found


def warm_imports() -> None:
    """Import what an async save's writer thread will use (an import on that thread holds the GIL
    while the training loop wants it back): this module's own imports at the top have done it."""
