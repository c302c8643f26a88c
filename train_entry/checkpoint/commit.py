"""Rank 0's commit of a save, in two halves, both the kernel's commit sequence
(hpctrain/kernel/checkpoint.py, which the runtime API uses too): `write_manifest` (the manifest
from every rank's checksums, fsynced with the folders while the ranks' own fsyncs may still run)
and, once every rank says its files are durable, `publish` (the rename that makes it a checkpoint,
`latest`, the prune)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.kernel import checkpoint as fmt
from hpctrain.kernel.files import utc_now
from train_entry.checkpoint.prune import Pruning


def commit(
    ck: Pruning,
    staging: Path,
    final: Path,
    step: int,
    world: int,
    files: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Both halves, for a caller whose files are all durable already."""
    write_manifest(ck, staging, final, step, world, files)
    publish(ck, staging, final, step)


def latest_tmp(ck: Pruning) -> Path:
    return fmt.latest_tmp(ck.dir)


def write_manifest(
    ck: Pruning,
    staging: Path,
    final: Path,
    step: int,
    world: int,
    files: dict[str, dict[str, Any]] | None = None,
) -> None:
    """Rank 0: the manifest from every rank's checksums (taken while writing; files nobody
    hashed, e.g. DeepSpeed's, are read, hashed and fsynced here), fsynced in parallel with the
    files not yet synced, the folders and a new `latest` temp file."""
    import torch

    from train_entry.checkpoint.writer import io_pool

    fields = {
        "step": step,
        "strategy": ck.strategy,
        "world_size": world,
        "torch": torch.__version__,
        "time": utc_now(),
    }
    fmt.write_manifest(staging, final, fields, files, pool=io_pool())


def publish(ck: Pruning, staging: Path, final: Path, step: int) -> None:
    """Rank 0, once every file of the folder is durable: rename, `latest`, one fsync of the
    checkpoints folder; then prune (the delete runs on a thread)."""
    fmt.publish(staging, final)
    ck._prune(step)
