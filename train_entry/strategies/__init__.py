"""Compose the strategies in one fixed order: activation checkpointing, compile, then ddp|fsdp|deepspeed.

The order matters: checkpointing and compile act on the user's blocks, and must be in place before a
strategy shards or wraps them (FSDP2 shards block by block; DDP registers hooks on the final params).
Each strategy module has one keyword-only `wrap(model, cfg=..., ...)` returning a `Wrapped`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from train_entry.model import find_blocks


@dataclass
class Wrapped:
    """What the trainer drives. For one optimizer step with k micro-steps:

        for i in range(k):
            with w.sync(i == k - 1), w.autocast():
                loss = compute_loss(w.model, batch)
                w.backward(loss)
        grad_norm = w.step()
    """

    model: Any                                  # call it for forward: DDP/FSDP module or DeepSpeed engine
    optimizer: Any                              # None for DeepSpeed (the engine owns it)
    scheduler: Any
    scaler: Any = None
    backward: Callable[[torch.Tensor], None] = None
    step: Callable[[], float] = None            # optimizer step; returns the grad norm (nan if unknown)
    sync: Callable[[bool], ContextManager] = lambda last: contextlib.nullcontext()
    autocast: Callable[[], ContextManager] = contextlib.nullcontext
    lr: Callable[[], float] = None
    extra: dict = field(default_factory=dict)


def apply_activation_checkpointing(model: nn.Module, *, block_class: str | None) -> int:
    """Recompute each block in backward. Overrides the instance's forward instead of wrapping the
    module, so parameter names (and so checkpoints) are the same with and without it."""
    blocks = find_blocks(model, block_class)
    for block in blocks:
        inner = block.forward
        block.forward = lambda *a, _f=inner, **k: checkpoint(_f, *a, use_reentrant=False, **k)
    return len(blocks)


def apply_compile(model: nn.Module, *, block_class: str | None) -> None:
    # Per block (like torchtitan): blocks are identical, so one compiled graph is reused; names unchanged.
    for block in find_blocks(model, block_class) or [model]:
        block.compile()


def wrap(model: nn.Module, *, cfg: Any, device: torch.device, grad_accum: int) -> Wrapped:
    # 1. activation checkpointing, per block
    if cfg.train.activation_checkpointing:
        apply_activation_checkpointing(model, block_class=cfg.fsdp.block_class)
    # 2. torch.compile, per block
    if cfg.train.compile:
        apply_compile(model, block_class=cfg.fsdp.block_class)
    # 3. the data-parallel strategy (each builds its optimizer after wrapping: FSDP2 turns params
    #    into DTensors, DeepSpeed partitions them)
    if cfg.strategy == "ddp":
        from train_entry.strategies.ddp import wrap as wrap_ddp
        return wrap_ddp(model, cfg=cfg, device=device, grad_accum=grad_accum)
    if cfg.strategy == "fsdp":
        from train_entry.strategies.fsdp import wrap as wrap_fsdp
        return wrap_fsdp(model, cfg=cfg, device=device, grad_accum=grad_accum)
    from train_entry.strategies.deepspeed import wrap as wrap_ds
    return wrap_ds(model, cfg=cfg, device=device, grad_accum=grad_accum)


def clip_and_step(w: Wrapped, params: list[nn.Parameter], max_norm: float | None) -> float:
    """Unscale (fp16), clip, step, zero the grads, advance the schedule: the DDP/FSDP optimizer step."""
    if w.scaler is not None:
        w.scaler.unscale_(w.optimizer)
    norm = float("nan")
    if max_norm is not None:
        total = torch.nn.utils.clip_grad_norm_(params, max_norm)
        norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)
    if w.scaler is not None:
        w.scaler.step(w.optimizer)
        w.scaler.update()
    else:
        w.optimizer.step()
    w.optimizer.zero_grad(set_to_none=True)
    w.scheduler.step()
    return norm
