"""The checkpoint storage layer: one file per rank, hashed as it is fsynced, one fsync per file.

DCP's FileSystemWriter serialises every tensor with torch.save (a small zip archive per tensor) and
the checkpointer then read every file back to checksum it. This writer puts each rank's tensors'
raw bytes, one after the other (64-byte aligned), into a single `__<rank>_0.raw` file, fsyncs it
once on the I/O pool and, while the disk works, hashes the same buffers with xxh3_128 (sha256 took
11 ms of a core for 19 MB; xxh3 takes about 0.1 s for 600 MB, a tenth of a 1 GB save when it ran
between the writes), and remembers (size, xxh3_128) for the manifest, so nothing is read back.
The `.metadata` file (DCP's plan and where each tensor lies) is still DCP's own pickle, written the
same way, and read back only by a restricted unpickler (safeload.py). `RawReader` (reader.py,
public) loads such files (and DCP's own `.distcp` files, so older checkpoints still load); the
shape and dtype of each stored chunk come from DCP's metadata.

Also here: `SyncedFiles`, small side files (RNG, loop state, config) written with their checksum
taken from memory and their fsyncs run on the I/O pool.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import threading
import time
from concurrent.futures import Future as _CFuture
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import xxhash
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from hpctrain.kernel.checkpoint import RNG, XXH3
from train_entry.checkpoint.reader import RAW_SUFFIX, RawReader  # noqa: F401  (its reader)
from train_entry.checkpoint.safeload import refusals
from train_entry.compat import WriterBase, load_everything, stamp, storage_info

ALIGN = 64
METADATA = ".metadata"


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a CPU tensor, without a copy when it is contiguous (any dtype)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.numel() == 0:
        return memoryview(b"")
    if t.dtype in _NUMPY_DTYPES:  # numpy's view is a few microseconds cheaper than torch's
        return t.numpy().reshape(-1).view("u1").data  # the array's memoryview
    return t.reshape(-1).view(torch.uint8).numpy().data


_NUMPY_DTYPES = {
    torch.float64,
    torch.float32,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
}
SMALL = 256 << 10  # tensors smaller than this are gathered into one write (0-dim steps, biases)
CHUNK = 1 << 20


class HashingWriter(WriterBase):
    """A DCP StorageWriter: one raw file per rank; `entries` holds {relative path: {"size",
    "sha256"}} of what this rank wrote, `phases` the seconds spent writing, hashing, syncing."""

    def __init__(self, path: str | os.PathLike[str], tail: bytes | None = None) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, overwrite=True)
        # this rank's generators (JSON), appended after its tensors: no RNG file per rank
        self.tail = tail
        self.entries: dict[str, dict[str, object]] = {}
        self.phases: dict[str, float] = {}
        self.final_plan: SavePlan | None = None
        self._fsync: _CFuture[float] | None = None

    def durable(self) -> None:
        """Wait until this rank's raw file is fsynced (started by `write_plan`)."""
        fsync, self._fsync = self._fsync, None
        if fsync is not None:
            t0 = time.perf_counter()
            try:
                self.phases["fsync_s"] = fsync.result()
            finally:
                self.phases["fsync_wait_s"] = time.perf_counter() - t0

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        Path(self.path).mkdir(parents=True, exist_ok=True)  # no existing-checkpoint probe
        return plan

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(self.write_plan(plan, planner))
        return fut

    def write_plan(self, plan: SavePlan, planner: SavePlanner) -> list[WriteResult]:
        """Write this rank's items of `plan` (DCP's final local plan) into its one file; remember
        the plan (`final_plan`, for the next save's cached plan) and return where each item lies."""
        t_start = time.perf_counter()
        Path(self.path).mkdir(parents=True, exist_ok=True)
        name = f"{plan.storage_data.prefix}0{RAW_SUFFIX}"
        results: list[WriteResult] = []
        offset = 0
        write_s = 0.0
        tail: dict[str, object] | None = None
        # bytes first (small, pickled by the planner), then tensors in plan order; small pieces
        # are gathered into one buffer so a save is a few large writes
        items = sorted(plan.items, key=lambda i: i.type != WriteItemType.BYTE_IO)
        pending = bytearray()
        written: list[bytes | bytearray | memoryview] = []  # in file order, for the digest
        fd = os.open(Path(self.path) / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            with os.fdopen(fd, "wb", buffering=0, closefd=False) as f:

                def put(buf: bytes | bytearray | memoryview) -> None:
                    nonlocal write_s
                    written.append(buf)
                    t0 = time.perf_counter()
                    f.write(buf)
                    write_s += time.perf_counter() - t0

                for item in items:
                    data = planner.resolve_data(item)
                    buf = data.getbuffer() if isinstance(data, io.BytesIO) else tensor_bytes(data)
                    pad = -offset % ALIGN
                    offset += pad
                    pending += bytes(pad)
                    if len(buf) < SMALL:
                        pending += buf
                    else:
                        if pending:
                            put(pending)
                            pending = bytearray()  # `written` still holds the old one
                        put(buf)
                    if len(pending) >= CHUNK:
                        put(pending)
                        pending = bytearray()
                    results.append(
                        WriteResult(
                            index=item.index,
                            size_in_bytes=len(buf),
                            storage_data=storage_info(name, offset, len(buf)),
                        )
                    )
                    offset += len(buf)
                if self.tail is not None:  # outside DCP's items: its readers never see it
                    pad = -offset % ALIGN
                    pending += bytes(pad) + self.tail
                    tail = {"offset": offset + pad, "size": len(self.tail)}
                    tail["sha256"] = hashlib.sha256(self.tail).hexdigest()
                    offset += pad + len(self.tail)
                if pending:
                    put(pending)
        except BaseException:
            os.close(fd)
            raise
        # the fsync runs on the I/O pool while the digest is taken (the CPU waits for the disk
        # then; xxhash releases the GIL) and the checksums go to rank 0 (`durable()` waits)
        self._fsync = io_pool().submit(_fsync_close, fd)
        t0 = time.perf_counter()
        hasher = xxhash.xxh3_128()
        for chunk in written:
            hasher.update(chunk)
        hash_s = time.perf_counter() - t0
        self.entries[name] = {"size": offset, XXH3: hasher.hexdigest()}
        if tail is not None:
            self.entries[name][RNG] = tail
        self.final_plan = plan
        self.phases.update(
            write_s=write_s,
            hash_s=hash_s,
            write_data_s=time.perf_counter() - t_start,
        )
        return results

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The coordinator: DCP's .metadata, written straight into the (staging) folder."""
        stamp(metadata)  # the format version, as this torch's own writer stamps it (if any)
        metadata.storage_data = {wr.index: wr.storage_data for wrs in results for wr in wrs}
        # a str, not a Path: Python 3.13 pickles a Path as pathlib._local.PosixPath, which 3.11
        # and 3.12 cannot load (a checkpoint written on a site's 3.13 must load anywhere)
        metadata.storage_meta = StorageMeta(
            checkpoint_id=str(self.checkpoint_id), save_id=self.save_id
        )
        blob = pickle.dumps(metadata)
        # not fsynced here: the commit fsyncs every file it did not write itself, in parallel
        with open(Path(self.path) / METADATA, "wb") as f:
            f.write(blob)
        self.entries[METADATA] = {
            "size": len(blob),
            "sha256": hashlib.sha256(blob).hexdigest(),
            "unsynced": True,
        }


def load_plain(folder: str | os.PathLike[str]) -> dict[str, object]:
    """The whole state dict of a DCP checkpoint (raw or DCP's own files) on CPU, without a
    process group: what torch's dcp_to_torch_save loads, for our raw files too."""
    with refusals():
        return load_everything(RawReader(str(folder)))


def _fsync_close(fd: int) -> float:
    try:
        t0 = time.perf_counter()
        os.fsync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def io_pool() -> ThreadPoolExecutor:
    """The process's pool for parallel fsyncs and checksums, started once (a thread start per
    fsync and per save cost milliseconds on a loaded machine)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="hpctrain-io")
        return _POOL


class SyncedFiles:
    """Small files written now, checksummed from memory, fsynced on the I/O pool; `wait()`
    returns their {relative path: {"size", "sha256"}} once every fsync is done."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.entries: dict[str, dict[str, object]] = {}
        self.tail: bytes | None = None  # this rank's generators, for its weights file's end
        self._pool = io_pool()
        self._futures: list[_CFuture[float]] = []

    def write(self, rel: str, data: bytes | str) -> None:
        """Written now (so the file is there when rank 0 lists the folder), fsynced on the pool."""
        blob = data.encode() if isinstance(data, str) else data
        self.entries[rel] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        if "/" in rel:  # an engine's rng/rank-<R>.json
            (self.root / rel).parent.mkdir(exist_ok=True)
        fd = os.open(self.root / rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view) :]
        except BaseException:
            os.close(fd)
            raise
        self._futures.append(self._pool.submit(_fsync_close, fd))

    def wait(self) -> dict[str, dict[str, object]]:
        futures, self._futures = self._futures, []
        errors = []
        for f in futures:  # every one finished before returning, the first error raised
            try:
                f.result()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
        if errors:
            raise errors[0]
        return self.entries
