"""Optimizer and LR schedule from the config (shared by every strategy: one source of truth)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from train_entry.config import TrainConfig


def build_optimizer(
    params: Iterable[torch.nn.Parameter], cfg: TrainConfig
) -> torch.optim.Optimizer:
    o = cfg.optim
    if o.name == "sgd":
        return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay)
    # torch AdamW (not DeepSpeed's C++ Adams): it resumes bit-exactly (see shared/notes/cpu-distributed.md)
    return torch.optim.AdamW(
        params, lr=o.lr, betas=(o.betas[0], o.betas[1]), eps=o.eps, weight_decay=o.weight_decay
    )


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of optim.lr after `step` optimizer steps: linear warmup, then the configured decay."""
    s, total = cfg.schedule, cfg.train.max_steps
    if step < s.warmup_steps:
        return float((step + 1) / (s.warmup_steps + 1))
    if s.decay == "constant":
        return 1.0
    progress = min(1.0, (step - s.warmup_steps) / max(1, total - s.warmup_steps))
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if s.decay == "cosine" else 1 - progress
    return float(s.min_lr_ratio + (1 - s.min_lr_ratio) * shape)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
