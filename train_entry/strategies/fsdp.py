"""FSDP2: fully_shard every block, then the root; gradient sync off on non-final micro-steps."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager as ContextManager
from typing import TypedDict

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from hpctrain.kernel.errors import UserError
from train_entry.config import TrainConfig
from train_entry.model import find_blocks, on_meta
from train_entry.optim import DTYPES, build_optimizer, build_scheduler
from train_entry.strategies.base import Strategy, clip_and_step


class ShardOptions(TypedDict, total=False):
    """fully_shard's keyword arguments."""

    reshard_after_forward: bool
    mp_policy: MixedPrecisionPolicy
    offload_policy: OffloadPolicy
    mesh: DeviceMesh


@contextlib.contextmanager
def _sync(model: FSDPModule, last: bool) -> Iterator[None]:
    # Off: gradients accumulate unsharded-free locally; the last micro-step reduce-scatters them all.
    model.set_requires_gradient_sync(last)
    yield


class FSDPStrategy(Strategy):
    """FSDP2: every block sharded (fully_shard), then the root; mixed precision per unit."""

    name = "fsdp"
    # set by wrap()
    max_norm: float | None
    params: list[nn.Parameter]

    @staticmethod
    def options(cfg: TrainConfig, device: torch.device) -> ShardOptions:
        """fully_shard's keyword arguments from the config (mixed precision, offload)."""
        f = cfg.fsdp
        param_dtype = DTYPES[f.param_dtype or cfg.train.precision]
        kwargs: ShardOptions = {"reshard_after_forward": f.reshard_after_forward}
        if param_dtype != torch.float32:
            kwargs["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=param_dtype, reduce_dtype=DTYPES[f.reduce_dtype]
            )
        if f.cpu_offload and device.type != "cpu":
            # On a CPU run the shards already live in host memory (and CPUOffloadPolicy needs an
            # accelerator), so cpu_offload changes nothing there.
            kwargs["offload_policy"] = CPUOffloadPolicy()
        return kwargs

    @classmethod
    def shard(
        cls,
        model: nn.Module,
        *,
        cfg: TrainConfig,
        device: torch.device,
        mesh: DeviceMesh | None = None,
    ) -> int:
        """fully_shard every block, then the root (embeddings, head, anything outside the blocks);
        over `mesh` (the device mesh's dp dimension) when given. Returns the number of blocks."""
        kwargs = cls.options(cfg, device)
        if mesh is not None:
            kwargs["mesh"] = mesh
        # meta: an hf: model, loaded once sharded (train_entry/pretrained/)
        if "offload_policy" not in kwargs and not on_meta(model):
            model = model.to(device)
        f = cfg.fsdp
        blocks = find_blocks(model, f.block_class)
        if f.block_class and not blocks:
            raise UserError(
                f"fsdp.block_class '{f.block_class}' matches no module of "
                f"{type(model).__name__}; name a class of its repeated blocks, or unset it"
            )
        for block in blocks:
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        return len(blocks)

    @classmethod
    def wrap(
        cls, model: nn.Module, *, cfg: TrainConfig, device: torch.device, grad_accum: int
    ) -> FSDPStrategy:
        precision = cfg.train.precision
        param_dtype = DTYPES[cfg.fsdp.param_dtype or precision]
        n_blocks = cls.shard(model, cfg=cfg, device=device)
        kwargs = cls.options(cfg, device)
        optimizer = build_optimizer(model.parameters(), cfg)
        scaler = None
        if precision == "fp16" or param_dtype == torch.float16:
            scaler = ShardedGradScaler(device=device.type)
        s = cls(
            model,
            optimizer,
            build_scheduler(optimizer, cfg),
            scaler,
            device=device,
            grad_accum=grad_accum,
            extra={"blocks": n_blocks, "cpu_offload": "offload_policy" in kwargs},
        )
        s.max_norm, s.params = cfg.train.clip_grad_norm, list(model.parameters())
        return s

    def step(self) -> float:
        return clip_and_step(self, self.params, self.max_norm)

    def sync(self, last: bool) -> ContextManager[object]:
        return _sync(self.model, last)


STRATEGY = FSDPStrategy
