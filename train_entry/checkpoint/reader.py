"""Reading hpctrain's DCP checkpoints with stock torch.distributed.checkpoint: `RawReader`.

train_entry's writer (writer.py) puts each rank's tensors, raw, into one `__<rank>_0.raw` file; the
`.metadata` file is DCP's own (the plan, every tensor's global shape, dtype and chunks, and where
each chunk lies). Stock `FileSystemReader` expects a torch.save archive per chunk and cannot read
the raw bytes; `RawReader` is a `FileSystemReader` that can (and still reads DCP's own `.distcp`
files through DCP's code). It is public API, built on torch's public DCP interfaces only:

    import torch, torch.distributed.checkpoint as dcp
    from train_entry.checkpoint.reader import RawReader, load_full

    sd = {"app": {"model": model.state_dict()}}          # what train_entry saves under "app"
    dcp.load(sd, storage_reader=RawReader("runs/demo/checkpoints/step-00000060"))
    model.load_state_dict(sd["app"]["model"])

    weights = load_full("runs/demo/checkpoints/step-00000060", prefix="app.model.")
    torch.save(weights, "model.pt")                      # what dcp_to_torch_save does, weights only

Works without a process group (one process, any world size saved) and inside one (any mesh or
sharding: DCP reshards by the chunks in the metadata). Only the bytes of the requested chunks are
read. Nothing read runs code (stock FileSystemReader unpickles `.metadata` and DCP's planner every
bytes item fully): the metadata goes through a restricted unpickler and bytes items are loaded
weights-only (safeload.py); anything else is refused with one line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import BinaryIO, cast

import torch
import xxhash
from torch.distributed.checkpoint.metadata import (
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from hpctrain.kernel.checkpoint import read_verified
from hpctrain.kernel.digests import XXH3, algo_of, verify_files
from train_entry.checkpoint.safeload import load_metadata, metadata_from, refusals, safe_bytes
from train_entry.compat import FileSystemReader, dcp_load

RAW_SUFFIX = ".raw"
DENSE = 0.5  # map the whole file when at least this share of it is wanted


class Damaged(Exception):
    """A file this rank was to read does not match the manifest (a resume tries an older one).
    `written`: found as its tensors were copied (they hold some of its bytes)."""

    def __init__(self, why: str, *, written: bool = False) -> None:
        super().__init__(why)
        self.written = written


class RawReader(FileSystemReader):
    """A DCP StorageReader for hpctrain checkpoints (raw per-rank files, or DCP's own files).
    With `manifest` (checked: kernel/checkpoint.check_manifest), this rank verifies what it reads:
    the metadata's bytes in memory and DCP's own files before reading them (`prepare_local_plan`),
    each weights file as it reads it into the tensors (`_read_checked`: Damaged(written=True) after
    the fact; load.py then loads an older checkpoint over them); `verified` lists those files."""

    def __init__(
        self, path: str | os.PathLike[str], *, manifest: Mapping[str, object] | None = None
    ) -> None:
        super().__init__(path)
        self.manifest = manifest
        self.verified: list[str] = []
        self._blobs: dict[str, bytes] = {}

    # DCP passes its own arguments (a rank in some torch releases)
    def read_metadata(self, *args: object, **kwargs: object) -> Metadata:
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        if self.manifest is None:
            md = load_metadata(Path(self.path) / name)
        else:
            blob = self._blobs.get(name)
            if blob is None:  # read and checked once (the resume's is_flat, then DCP's load)
                try:
                    blob = self._blobs[name] = read_verified(Path(self.path), self.manifest, name)
                except ValueError as exc:
                    raise Damaged(str(exc)) from None
            md = metadata_from(io.BytesIO(blob), Path(self.path) / name)
        if getattr(md, "storage_meta", None) is None:  # as FileSystemReader does
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = getattr(self, "load_id", None)  # type: ignore[union-attr]
        return md

    def set_up_storage_reader(
        self,
        metadata: Metadata,
        is_coordinator: bool,
        *args: object,  # whatever this torch's DCP passes on
        **kwargs: object,
    ) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._md = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        if self.manifest is not None:
            rels = {self.storage_data[r.storage_index].relative_path for r in plan.items}
            # DCP's own files (before the raw format) are checked whole before they are read;
            # the weights files as they are read (read_data)
            old = sorted(r for r in rels if not r.endswith(RAW_SUFFIX))
            why = verify_files(Path(self.path), self.manifest, old)
            if why is not None:
                raise Damaged(why)
            self.verified = old
        return super().prepare_local_plan(plan)

    def _chunk(self, index: MetadataIndex) -> tuple[torch.dtype, torch.Size]:
        meta = self._md.state_dict_metadata[index.fqn]
        assert index.offset is not None  # a tensor chunk's index always has its offset
        if not isinstance(meta, TensorStorageMetadata):  # asked only for tensors (not BYTE_IO)
            raise KeyError(f"{index.fqn} is stored as bytes, not as a tensor")
        for chunk in meta.chunks:
            if tuple(chunk.offsets) == tuple(index.offset):
                return meta.properties.dtype, chunk.sizes
        raise KeyError(f"no stored chunk of {index.fqn} at offset {tuple(index.offset)}")

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        raw: dict[str, list[ReadItem]] = {}
        other = []
        for req in plan.items:
            rel = self.storage_data[req.storage_index].relative_path
            if rel.endswith(RAW_SUFFIX):
                raw.setdefault(rel, []).append(req)
            else:
                other.append(req)
        if other:  # DCP's own files (checkpoints written before the raw format)
            safe = cast(LoadPlanner, _SafeBytes(planner, self.path))
            super().read_data(dataclasses.replace(plan, items=other), safe).wait()
        for rel, reqs in raw.items():
            self._read_raw(rel, reqs, planner)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _read_raw(self, rel: str, reqs: list[ReadItem], planner: LoadPlanner) -> None:
        """`reqs` from the weights file `rel` (with a manifest: `_read_checked`)."""
        path = Path(self.path) / rel
        infos = [self.storage_data[r.storage_index] for r in reqs]
        size = path.stat().st_size
        with open(path, "rb", buffering=0) as f:
            if self.manifest is not None:
                self._read_checked(rel, f, reqs, planner)
                return
            # A resume reads (nearly) the whole file: mapped at once (torch.from_file, 3x faster
            # than reading it into a buffer). An export of a few tensors reads only theirs (the
            # file may be far larger than memory).
            whole = (
                torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
                if sum(i.length for i in infos) >= DENSE * size
                else None
            )
            for req, info in zip(reqs, infos, strict=True):
                if whole is not None:
                    piece = whole[info.offset : info.offset + info.length]
                else:
                    piece = _read(f, info.offset, info.length)
                if req.type == LoadItemType.BYTE_IO:
                    what = f"{path}: {req.storage_index.fqn}"
                    planner.load_bytes(req, safe_bytes(piece.numpy().tobytes(), what))
                else:
                    self._copy(req, piece, planner)

    def _read_checked(
        self, rel: str, f: BinaryIO, reqs: list[ReadItem], planner: LoadPlanner
    ) -> None:
        """`reqs` from the weights file `rel` (open as `f`) in one pass over its bytes, in file
        order, its digest taken as they come: a tensor that is all of a stored chunk is read
        straight into its place, each step hashed there (in the cache); any other piece read into
        a buffer, hashed, copied. Its bytes items are parsed, and the file counts as read, once
        its digest matches; else Damaged: the tensors hold some of its bytes, and the ranks go on
        to an older checkpoint, which overwrites them (load.py)."""
        assert self.manifest is not None
        digest = _Digest(self.manifest, rel, f)
        later: list[tuple[ReadItem, torch.Tensor]] = []
        for req in sorted(reqs, key=lambda r: self.storage_data[r.storage_index].offset):
            info = self.storage_data[req.storage_index]
            start, end = info.offset, info.offset + info.length
            if req.type == LoadItemType.BYTE_IO:
                later.append((req, digest.read(start, end)))
                continue
            target = planner.resolve_tensor(req).detach()
            dtype, sizes = self._chunk(req.storage_index)
            whole = (
                target.dtype == dtype
                and tuple(target.size()) == tuple(sizes)
                and target.is_contiguous()
                and target.numel() * target.element_size() == info.length
            )
            if whole and digest.into(start, target):
                planner.commit_tensor(req, target)
            else:
                self._copy(req, digest.read(start, end), planner)
        why = digest.finish()
        if why is not None:
            raise Damaged(why, written=True)
        self.verified.append(rel)
        for req, piece in later:
            what = f"{Path(self.path) / rel}: {req.storage_index.fqn}"
            planner.load_bytes(req, safe_bytes(piece.numpy().tobytes(), what))

    def _copy(self, req: ReadItem, piece: torch.Tensor, planner: LoadPlanner) -> None:
        """The stored chunk's bytes `piece` (uint8) into the tensor `req` names."""
        dtype, sizes = self._chunk(req.storage_index)
        tensor = piece.view(dtype).reshape(sizes)
        for dim, (off, n) in enumerate(zip(req.storage_offsets, req.lengths, strict=True)):
            tensor = tensor.narrow(dim, off, n)
        target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise AssertionError(
                f"{req.storage_index}: stored {tuple(tensor.size())}, wanted {tuple(target.size())}"
            )
        target.copy_(tensor)
        planner.commit_tensor(req, target)


STEP = 4 << 20  # read into place, then hashed while still in the cache


class _Digest:
    """The digest of one weights file (open as `f`), taken as a load reads it in file order."""

    def __init__(self, manifest: Mapping[str, object], rel: str, f: BinaryIO) -> None:
        files = manifest["files"]
        entry = files.get(rel) if isinstance(files, dict) else None
        algo = algo_of(entry) if isinstance(entry, dict) else None
        size = os.fstat(f.fileno()).st_size
        # found in read_data: this rank may have read other files into its tensors already
        if not isinstance(entry, dict) or algo is None:
            raise Damaged(f"{rel} is not listed in the manifest", written=True)
        if size != entry["size"]:
            raise Damaged(f"{rel} is {size} bytes, the manifest says {entry['size']}", written=True)
        self.rel, self.entry, self.algo, self.f, self.size = rel, entry, algo, f, size
        self._hash = xxhash.xxh3_128() if algo == XXH3 else hashlib.sha256()
        self.done = 0  # the bytes hashed: the file's first `done`
        # every byte is read (the digest): the kernel reads the whole file ahead now, while this
        # thread copies and hashes what has come in
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)

    def read(self, start: int, end: int) -> torch.Tensor:
        """Bytes [start, end) as a uint8 tensor, hashed (the bytes before them too)."""
        self._skip(start)
        piece = _read(self.f, start, end - start)
        if end > self.done:
            self._hash.update(piece[self.done - start :].numpy().data)
            self.done = end
        return piece

    def into(self, start: int, target: torch.Tensor) -> bool:
        """The file's bytes from `start` read straight into the contiguous `target` (all of its
        bytes), each step hashed once it is there; False (nothing read) if some of them were
        hashed already (a chunk read twice)."""
        if start < self.done:
            return False
        self._skip(start)
        view = target.reshape(-1).view(torch.uint8).numpy().data
        for a in range(0, len(view), STEP):
            step = view[a : a + STEP]
            _fill(self.f, step, start + a)
            self._hash.update(step)
        self.done = start + len(view)
        return True

    def _skip(self, start: int) -> None:
        """Hash the bytes between the last read and `start` (padding)."""
        if start > self.done:
            self.read(self.done, start)

    def finish(self) -> str | None:
        """Why the file does not match its digest, or None; the rest of it hashed first."""
        for a in range(self.done, self.size, STEP):
            self.read(a, min(a + STEP, self.size))
        if self._hash.hexdigest() != self.entry[self.algo]:
            return f"{self.rel} does not match its {self.algo} checksum (corrupted)"
        return None


class _SafeBytes:
    """The planner as DCP's own read_data sees it, but bytes items loaded weights-only first."""

    def __init__(self, planner: LoadPlanner, path: object) -> None:
        self._planner, self._path = planner, path

    def load_bytes(self, req: ReadItem, value: io.BytesIO) -> None:
        what = f"{self._path}: {req.storage_index.fqn}"
        self._planner.load_bytes(req, safe_bytes(value.read(), what))

    def __getattr__(self, name: str) -> object:  # whatever the planner holds
        return getattr(self._planner, name)


def _read(f: BinaryIO, offset: int, length: int) -> torch.Tensor:
    """`length` bytes at `offset` as a uint8 tensor (64-byte aligned storage, so any dtype views)."""
    buf = torch.empty(length, dtype=torch.uint8)
    _fill(f, buf.numpy().data, offset)
    return buf


def _fill(f: BinaryIO, view: memoryview, offset: int) -> None:
    """`view` filled with the bytes of `f` at `offset`."""
    got = 0
    while got < len(view):
        n = os.preadv(f.fileno(), [view[got:]], offset + got)
        if n <= 0:
            raise OSError(f"{f.name}: {len(view)} bytes at {offset} wanted, the file ends first")
        got += n


def tensor_entries(
    folder: str | os.PathLike[str], prefix: str = ""
) -> dict[str, TensorStorageMetadata]:
    """Every tensor of a checkpoint whose flattened name starts with `prefix` (DCP names:
    "app.model.<parameter>"), with its global size and dtype, in the metadata's order."""
    md = RawReader(str(folder)).read_metadata()
    return {
        k: m
        for k, m in md.state_dict_metadata.items()
        if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)
    }


def load_full(
    folder: str | os.PathLike[str], prefix: str = "", keys: Iterable[str] | None = None
) -> dict[str, torch.Tensor]:
    """The full (unsharded) tensors of a checkpoint on CPU, named without `prefix`: those whose
    name starts with `prefix`, or only `keys` (full names). One process, no process group."""
    entries = tensor_entries(folder, prefix)
    names = list(entries) if keys is None else list(keys)
    sd = {
        k: torch.empty(entries[k].size, dtype=entries[k].properties.dtype, device="cpu")
        for k in names
    }
    # DCP warns "assuming the intent is to load in a single process": it is
    with warnings.catch_warnings(), refusals():
        warnings.simplefilter("ignore", UserWarning)
        dcp_load(sd, storage_reader=RawReader(str(folder)))
    return {k.removeprefix(prefix): v for k, v in sd.items()}
