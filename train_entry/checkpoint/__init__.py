"""Atomic, verified checkpoints for DDP, FSDP2 (torch.distributed.checkpoint) and DeepSpeed (its engine).

One save, whatever the strategy:
  1. every rank writes into checkpoints/.staging-step-<N>/: the weights and optimizer (DCP shards, or
     the DeepSpeed engine's files), rng/rank-<R>.json (this rank's generators), and rank 0 writes
     train_state.json (step, epoch, micro-step, data position, scheduler, scaler) and config.json;
  2. rank 0, once every rank's files are on disk: fsyncs them, writes MANIFEST.json last (every file
     with size and sha256, world size, strategy, step, torch version), renames the folder to
     checkpoints/step-<8 digits>, then replaces checkpoints/latest (temp file + rename), then prunes.
A folder named step-<N> therefore always has a manifest; a crash leaves at most a .staging-* folder.

Load: the newest step-<N> whose manifest verifies (sizes and checksums). A truncated or corrupted one
is reported (one warning line naming it and why) and skipped; nothing is deleted because of it.

The parts: checkpointer.py (the Checkpointer: triggers, sync saves), load.py (load_latest),
asyncsave.py (async saves), prune.py (old folders), ranks.py (the collectives), writer.py (the
storage layer: one raw file per rank, hashed while written; its reader), staging.py (the reusable
staging buffers of async saves), commit.py (rank 0's commit), compare.py (comparing two
checkpoints), common.py (SaveFailed, the DCP holder, the planner). The format itself
(names, manifest, verify, latest) is torch-free in hpctrain/kernel/checkpoint.py, re-exported here.
Importing this package imports no torch; the Checkpointer imports it when used.
"""

from __future__ import annotations

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
from train_entry.checkpoint.checkpointer import STRATEGIES, Checkpointer  # noqa: F401
from train_entry.checkpoint.common import LOW_SPACE, SaveFailed  # noqa: F401
from train_entry.checkpoint.compare import compare  # noqa: F401
