"""Rank 0's commit of a save, in two halves: `write_manifest` (the manifest from every rank's
checksums, fsynced with the folders while the ranks' own fsyncs may still run) and, once every rank
says its files are durable, `publish` (the rename that makes it a checkpoint, `latest`, the
prune)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hpctrain.kernel.checkpoint import FORMAT, LATEST, MANIFEST, list_files, sha256_file
from hpctrain.kernel.files import utc_now


def commit(
    ck: Any, staging: Path, final: Path, step: int, world: int, files: dict[str, dict] | None = None
) -> None:
    """Both halves, for a caller whose files are all durable already."""
    write_manifest(ck, staging, final, step, world, files)
    publish(ck, staging, final, step)


def latest_tmp(ck: Any) -> Path:
    return ck.dir / f".{LATEST}.tmp-{os.getpid()}"


def write_manifest(
    ck: Any, staging: Path, final: Path, step: int, world: int, files: dict[str, dict] | None = None
) -> None:
    """Rank 0: the manifest from every rank's checksums (taken while writing; files nobody
    hashed, e.g. DeepSpeed's, are read, hashed and fsynced here); the manifest, the files not yet
    synced, the folders and a new `latest` temp file fsynced in parallel (one fsync each). The
    folder is still `.staging-*`: nothing counts it before `publish`."""
    import torch

    from train_entry.checkpoint.writer import fsync_path as sync_one
    from train_entry.checkpoint.writer import io_pool, write_bytes_synced

    pool = io_pool()
    files = dict(files or {})
    unsynced = [r for r, e in files.items() if e.pop("unsynced", False)]
    rels = list_files(staging)
    extra = [r for r in rels if r not in files]
    missing = sorted(set(files) - set(rels))
    if missing:
        raise OSError(f"{staging}: {missing[0]} was written but is not there")

    def synced_entry(rel: str) -> dict:
        path = staging / rel
        sync_one(path)
        return {"size": path.stat().st_size, "sha256": sha256_file(path)}

    files.update(zip(extra, pool.map(synced_entry, extra), strict=True))
    manifest = {
        "format": FORMAT,
        "step": step,
        "strategy": ck.strategy,
        "world_size": world,
        "torch": torch.__version__,
        "time": utc_now(),
        "files": dict(sorted(files.items())),
    }
    blob = json.dumps(manifest, indent=1, sort_keys=True).encode()
    tmp = latest_tmp(ck)
    fd = os.open(staging / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, blob)
        dirs = {staging / Path(r).parent for r in rels} | {staging}
        jobs = [
            pool.submit(os.fsync, fd),
            *(pool.submit(sync_one, d) for d in dirs),
            *(pool.submit(sync_one, staging / r) for r in unsynced),
            pool.submit(write_bytes_synced, tmp, (final.name + "\n").encode()),
        ]
        for j in jobs:
            j.result()
    finally:
        os.close(fd)


def publish(ck: Any, staging: Path, final: Path, step: int) -> None:
    """Rank 0, once every file of the folder is durable: rename it to step-N, replace `latest`,
    one fsync of the checkpoints folder (it makes both renames durable; journaling filesystems
    keep their order, and a resume goes by the newest verified step-N, never by `latest`); then
    prune (the delete runs on a thread)."""
    from train_entry.checkpoint.writer import fsync_path as sync_one

    os.rename(staging, final)
    os.replace(latest_tmp(ck), ck.dir / LATEST)
    sync_one(ck.dir)  # the checkpoint (and then `latest`) is durable from here
    ck._prune(step)
