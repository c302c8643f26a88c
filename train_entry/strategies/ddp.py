"""DDP: replicate the model, all-reduce gradients in buckets; no_sync on all but the last micro-step."""

from __future__ import annotations

import contextlib
import inspect
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP

from hpctrain.runtime import fix_ddp_buckets
from train_entry.config import TrainConfig
from train_entry.optim import DTYPES, build_optimizer, build_scheduler
from train_entry.strategies.base import Strategy, clip_and_step


def _comm_hook(model: DDP, cfg: TrainConfig) -> None:
    hook = cfg.ddp.comm_hook
    if hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        # batched_powerSGD_hook fails on gloo (shared/notes/cpu-distributed.md); the layer-wise one works.
        state = psgd.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=cfg.ddp.powersgd_rank,
            start_powerSGD_iter=2,
            random_seed=cfg.train.seed,
        )
        model.register_comm_hook(state, psgd.powerSGD_hook)


class DDPStrategy(Strategy):
    """Replicated model; gradients all-reduced in buckets during the last micro-step's backward."""

    name = "ddp"
    # set by wrap()
    precision: str
    max_norm: float | None
    params: list[nn.Parameter]

    @classmethod
    def wrap(
        cls, model: nn.Module, *, cfg: TrainConfig, device: torch.device, grad_accum: int
    ) -> DDPStrategy:
        d = cfg.ddp
        # torch >= 2.13 renamed broadcast_buffers (per-forward buffer sync) to forward_sync_buffers
        # Any: spread into DDP(**buffers); the keyword differs between torch versions
        buffers: dict[str, Any] = (
            {"forward_sync_buffers": d.broadcast_buffers}
            if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
            else {"broadcast_buffers": d.broadcast_buffers}
        )
        model = DDP(
            model.to(device),
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=d.bucket_cap_mb,
            gradient_as_bucket_view=d.gradient_as_bucket_view,
            static_graph=d.static_graph,
            find_unused_parameters=d.find_unused_parameters,
            **buffers,
        )
        # the same bucket layout at every start (exact resumes with more than 2 ranks; why: there)
        fix_ddp_buckets(model)
        _comm_hook(model, cfg)
        optimizer = build_optimizer(model.parameters(), cfg)
        scaler = torch.amp.GradScaler(device.type) if cfg.train.precision == "fp16" else None
        s = cls(
            model,
            optimizer,
            build_scheduler(optimizer, cfg),
            scaler,
            device=device,
            grad_accum=grad_accum,
        )
        s.precision, s.max_norm, s.params = (
            cfg.train.precision,
            cfg.train.clip_grad_norm,
            list(model.parameters()),
        )
        return s

    def step(self) -> float:
        return clip_and_step(self, self.params, self.max_norm)

    def sync(self, last: bool) -> ContextManager[object]:
        # Gradients are all-reduced only in the last micro-step's backward.
        return contextlib.nullcontext() if last else self.model.no_sync()

    def autocast(self) -> ContextManager[object]:
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=DTYPES[self.precision])


STRATEGY = DDPStrategy
