"""Atomic, verified checkpoints for DDP, FSDP2 (torch.distributed.checkpoint) and DeepSpeed (its engine).

One save, whatever the strategy:
  1. every rank writes into checkpoints/.staging-step-<N>/: the weights and optimizer (DCP shards,
     its generators at the tail of its __<R>_0.raw; or the DeepSpeed engine's files and
     rng/rank-<R>.json), and rank 0 writes train_state.json (step, epoch, micro-step, data
     position, scheduler, scaler) and config.json: W + 4 files with the manifest;
  2. rank 0, once every rank's files are on disk: fsyncs them, writes MANIFEST.json last (every file
     with size and sha256, world size, strategy, step, torch version), renames the folder to
     checkpoints/step-<8 digits>, then replaces checkpoints/latest (temp file + rename), then prunes.
A folder named step-<N> therefore always has a manifest; a crash leaves at most a .staging-* folder.

Load: the newest step-<N> whose manifest verifies: rank 0 checks the manifest (names, sizes), each
rank the checksums of the files it reads, and the ranks agree. A truncated or corrupted one is
reported (one warning line naming it and why) and skipped; nothing is deleted because of it.

The parts: checkpointer.py (the Checkpointer: triggers, the order of a save, sync saves), steps.py
(the steps sync and async saves share), commit.py (the finish of a save; rank 0's commit),
asyncsave.py (async saves), load.py (load_latest), ranks.py (the collectives), prune.py (old
folders), statedict.py (the DCP holder, the state dict and plan caches), writer.py (the storage
layer: one raw file per rank, hashed while written), reader.py (its reader), staging.py (the
reusable staging buffers of async saves), safeload.py (reading without running code), export.py
(`hpctrain export`), compare.py (comparing two checkpoints), common.py (SaveFailed). The format
itself (names, manifest, verify, latest) is torch-free in hpctrain/kernel/checkpoint.py, re-exported
here. The engine's own save and load are its strategy's (train_entry/strategies/).

Importing this package imports no torch: the resume commands read the format through it on a login
node (tests/test_resume_check.py). The Checkpointer (torch) loads on first use; compare.py and the
other parts are imported as modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from hpctrain.kernel.checkpoint import (  # noqa: F401  (the format lives in the kernel; re-exported)
    FORMAT,
    LATEST,
    MANIFEST,
    STAGING_PREFIX,
    STEP_RE,
    list_files,
    newest_verified,
    sha256_file,
    staging_name,
    step_folders,
    step_name,
    step_of,
    verify,
)
from hpctrain.kernel.files import fsync_path, write_atomic  # noqa: F401  (re-exported, as before)
from train_entry.checkpoint.common import LOW_SPACE, SaveFailed  # noqa: F401

if TYPE_CHECKING:
    from train_entry.checkpoint.checkpointer import STRATEGIES, Checkpointer  # noqa: F401

_TORCH = ("Checkpointer", "STRATEGIES")  # checkpointer.py's; it imports torch (see the docstring)


def __getattr__(name: str) -> object:
    if name not in _TORCH:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("train_entry.checkpoint.checkpointer"), name)
