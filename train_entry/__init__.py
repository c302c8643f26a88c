"""train_entry: what torchrun runs on every node, and the same pieces as a library.

    from train_entry import init_distributed, wrap, Checkpointer, StopFlag, Trainer, TrainConfig

Attributes are imported on first use, so `import train_entry` stays cheap (no torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names below, for the type checker; at run time __getattr__ loads them
    from train_entry.checkpoint.checkpointer import Checkpointer as Checkpointer
    from train_entry.config import TrainConfig as TrainConfig
    from train_entry.config import load_config as load_config
    from train_entry.data import build_batches as build_batches
    from train_entry.dist import init_distributed as init_distributed
    from train_entry.dist import teardown as teardown
    from train_entry.model import build_model as build_model
    from train_entry.model import compute_loss as compute_loss
    from train_entry.preempt import StopFlag as StopFlag
    from train_entry.state import TrainState as TrainState
    from train_entry.state import params_sha256 as params_sha256
    from train_entry.strategies import Wrapped as Wrapped
    from train_entry.strategies import wrap as wrap
    from train_entry.trainer import Trainer as Trainer

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


def __getattr__(name: str) -> object:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'train_entry' has no attribute {name!r}")
