"""Compose the strategies in one fixed order: activation checkpointing, compile, then the
data-parallel strategy (ddp | fsdp | deepspeed); a run with tp or pp goes to the mesh strategy
(strategies/mesh.py), which keeps the same order per pipeline stage.

The order matters: checkpointing and compile act on the user's blocks, and must be in place before a
strategy shards or wraps them (FSDP2 shards block by block; DDP registers hooks on the final params).
Each strategy is one module with one Strategy class (strategies/base.py); STRATEGIES below is the
registry, keyed by the names in hpctrain/kernel/strategies.py (a new strategy: a module, a line
here, and a row there).
"""

from __future__ import annotations

import importlib

import torch
from torch import nn

from hpctrain.kernel import strategies as names
from train_entry.config import TrainConfig
from train_entry.model import apply_activation_checkpointing, apply_compile
from train_entry.parallel.dims import ParallelDims
from train_entry.strategies.base import Strategy, clip_and_step  # noqa: F401  (public names)
from train_entry.strategies.fsdp import FSDPStrategy
from train_entry.strategies.mesh import ParallelStrategy

STRATEGIES: dict[str, str] = {  # name -> module whose STRATEGY is the class
    "ddp": "train_entry.strategies.ddp",
    "fsdp": "train_entry.strategies.fsdp",
    "deepspeed": "train_entry.strategies.deepspeed",
}
assert tuple(STRATEGIES) == names.NAMES, "the registry follows hpctrain/kernel/strategies.py"
Wrapped = Strategy  # the name before strategy objects (train_entry's public exports)


def strategy_class(name: str) -> type[Strategy]:
    return importlib.import_module(STRATEGIES[name]).STRATEGY  # type: ignore[no-any-return]


def wrap(
    model: nn.Module,
    *,
    cfg: TrainConfig,
    device: torch.device,
    grad_accum: int,
    dims: ParallelDims | None = None,
) -> Strategy:
    if dims is not None and dims.mesh is not None:
        # tp/pp: one device mesh, the data-parallel strategy as its dp dimension (its `shard`;
        # hpctrain/kernel/strategies.py says which compose, checked at parse time)
        dp = strategy_class(cfg.strategy)
        assert issubclass(dp, FSDPStrategy)  # the one strategy with mesh=True (kernel/strategies)
        return ParallelStrategy.build(
            model,
            cfg=cfg,
            device=device,
            grad_accum=grad_accum,
            dims=dims,
            dp_strategy=dp,
        )
    # 1. activation checkpointing, per block
    if cfg.train.activation_checkpointing:
        apply_activation_checkpointing(model, block_class=cfg.fsdp.block_class)
    # 2. torch.compile, per block
    if cfg.train.compile:
        apply_compile(model, block_class=cfg.fsdp.block_class)
    # 3. the data-parallel strategy (each builds its optimizer after wrapping: FSDP2 turns params
    #    into DTensors, DeepSpeed partitions them)
    return strategy_class(cfg.strategy).wrap(model, cfg=cfg, device=device, grad_accum=grad_accum)
