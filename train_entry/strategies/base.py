"""The strategy interface the trainer drives. One optimizer step with k micro-steps:

    for i in range(k):
        loss = s.micro_step(batch, last=i == k - 1)   # with s.sync(last), s.autocast(): forward,
    grad_norm = s.step()                              # s.backward(loss)

Each strategy is one module in train_entry/strategies/ with one class built by `wrap(...)`;
train_entry/strategies/__init__.py holds the registry (names from hpctrain/kernel/strategies.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from train_entry.config import TrainConfig
from train_entry.model import compute_loss
from train_entry.state import params_sha256


@dataclass
class Weights:
    """The model tensors of one checkpoint: `specs` (name -> (shape, dtype), in model order) up
    front, `take(names)` the full CPU tensors of those names. `skipped`: entries that are no tensor
    (a module's extra state), left out of the export."""

    specs: dict[str, tuple[tuple[int, ...], torch.dtype]]
    take: Callable[[list[str]], dict[str, torch.Tensor]]
    skipped: list[str] = field(default_factory=list)


class Strategy:
    name: ClassVar[str]
    # the DDP/FSDP module, or DeepSpeed's engine, whose backward, step and get_lr its strategy calls
    model: Any  # Any: the DeepSpeed engine's methods are untyped

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        scheduler: LRScheduler,
        scaler: torch.amp.GradScaler | None = None,
        *,
        device: torch.device,
        grad_accum: int,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        self.model = model  # call it for forward: the DDP/FSDP module or the DeepSpeed engine
        self.optimizer = optimizer  # None when the strategy's engine owns it
        self.scheduler = scheduler
        self.scaler = scaler
        self.device = device  # where batches go
        self.grad_accum = grad_accum
        self.extra = extra or {}

    # ---- building and checking
    @classmethod
    def wrap(
        cls, model: nn.Module, *, cfg: TrainConfig, device: torch.device, grad_accum: int
    ) -> Strategy:
        raise NotImplementedError

    @staticmethod
    def validate(cfg: TrainConfig, *, world: int, accum: int) -> None:
        """Checks that need no process group (at parse time, before any process group exists)."""

    # ---- one step
    def micro_step(self, batch: object, last: bool) -> torch.Tensor:
        """Forward and backward of one micro-batch (gradients reduced when `last`); this rank's
        loss, detached. A pipeline runs all its stages' microbatches here (strategies/mesh.py)."""
        with self.sync(last), self.autocast():
            loss = compute_loss(self.model, batch)
            self.backward(loss)
        return loss.detach().float()

    def backward(self, loss: torch.Tensor) -> None:
        loss = loss / self.grad_accum
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self) -> float:
        """The optimizer step; returns the grad norm (nan if not computed)."""
        raise NotImplementedError

    def sync(self, last: bool) -> ContextManager[object]:
        """Around a micro-step: gradients are reduced only when `last`."""
        return contextlib.nullcontext()

    def autocast(self) -> ContextManager[object]:
        return contextlib.nullcontext()

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    # ---- state
    @property
    def checkpointed_scheduler(self) -> LRScheduler | None:
        """The scheduler the checkpointer saves (None when the engine saves its own)."""
        return self.scheduler

    @staticmethod
    def full_weights(folder: Path) -> Weights | None:
        """`hpctrain export`: the consolidated model weights of a checkpoint folder this strategy's
        engine wrote; None: DCP's files hold them."""
        return None

    # ---- a checkpoint its engine writes itself (kernel/strategies.py checkpoint="engine"); the
    # checkpointer calls these instead of DCP's save and load (train_entry/checkpoint/)
    @staticmethod
    def save_engine(model: nn.Module, *, folder: Path) -> None:
        """Write the engine's files (weights, optimizer, schedule) into `folder`, a save's staging
        folder (every rank)."""
        raise NotImplementedError("DCP saves this strategy's state")

    @staticmethod
    def load_engine(model: nn.Module, *, folder: Path) -> None:
        """Load what `save_engine` wrote into the checkpoint `folder` (every rank)."""
        raise NotImplementedError("DCP loads this strategy's state")

    @staticmethod
    def check_resume(folder: Path, *, saved_world: object, world: int) -> None:
        """Before a load: UserError when the checkpoint `folder`, saved by `saved_world` ranks,
        cannot load into this run's `world` ranks (every rank)."""

    def params_sha256(self) -> str:
        """Full parameter values, fixed order, whatever the sharding (a collective)."""
        return params_sha256(self.model)


def clip_and_step(s: Strategy, params: list[nn.Parameter], max_norm: float | None) -> float:
    """Unscale (fp16), clip, step, zero the grads, advance the schedule: the DDP/FSDP optimizer step."""
    assert s.optimizer is not None  # an engine's strategy (DeepSpeed) steps itself
    if s.scaler is not None:
        s.scaler.unscale_(s.optimizer)
    norm = float("nan")
    if max_norm is not None:
        total = torch.nn.utils.clip_grad_norm_(params, max_norm)
        norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)
    if s.scaler is not None:
        s.scaler.step(s.optimizer)
        s.scaler.update()
    else:
        s.optimizer.step()
    s.optimizer.zero_grad(set_to_none=True)
    s.scheduler.step()
    return norm
