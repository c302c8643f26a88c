"""train_entry: what torchrun runs on every node, and the same pieces as a library.

    from train_entry import init_distributed, wrap, Checkpointer, StopFlag, Trainer, TrainConfig

Attributes are imported on first use, so `import train_entry` stays cheap (no torch).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TrainConfig": "train_entry.config",
    "load_config": "train_entry.config",
    "init_distributed": "train_entry.dist",
    "teardown": "train_entry.dist",
    "wrap": "train_entry.strategies",
    "Wrapped": "train_entry.strategies",
    "Checkpointer": "train_entry.checkpoint",
    "TrainState": "train_entry.state",
    "params_sha256": "train_entry.state",
    "StopFlag": "train_entry.preempt",
    "Trainer": "train_entry.trainer",
    "build_model": "train_entry.model",
    "build_batches": "train_entry.data",
    "compute_loss": "train_entry.model",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'train_entry' has no attribute {name!r}")
