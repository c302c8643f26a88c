"""FSDP2: fully_shard every block, then the root; gradient sync off on non-final micro-steps."""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from hpctrain.kernel.errors import UserError
from train_entry.model import find_blocks
from train_entry.optim import DTYPES, build_optimizer, build_scheduler
from train_entry.strategies import Wrapped, clip_and_step


@contextlib.contextmanager
def _sync(model: Any, last: bool):
    # Off: gradients accumulate unsharded-free locally; the last micro-step reduce-scatters them all.
    model.set_requires_gradient_sync(last)
    yield


def wrap(model: nn.Module, *, cfg: Any, device: torch.device, grad_accum: int) -> Wrapped:
    f, precision = cfg.fsdp, cfg.train.precision
    param_dtype = DTYPES[f.param_dtype or precision]
    kwargs: dict[str, Any] = {"reshard_after_forward": f.reshard_after_forward}
    if param_dtype != torch.float32:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=DTYPES[f.reduce_dtype])
    if f.cpu_offload and device.type != "cpu":
        kwargs["offload_policy"] = CPUOffloadPolicy()
    else:
        # On a CPU run the shards already live in host memory (and CPUOffloadPolicy needs an
        # accelerator), so cpu_offload changes nothing there.
        model = model.to(device)
    blocks = find_blocks(model, f.block_class)
    if f.block_class and not blocks:
        raise UserError(f"fsdp.block_class '{f.block_class}' matches no module of "
                        f"{type(model).__name__}; name a class of its repeated blocks, or unset it")
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)   # the root: embeddings, head and anything outside the blocks
    optimizer = build_optimizer(model.parameters(), cfg)
    scaler = None
    if precision == "fp16" or param_dtype == torch.float16:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
        scaler = ShardedGradScaler(device=device.type)
    w = Wrapped(model=model, optimizer=optimizer, scheduler=build_scheduler(optimizer, cfg), scaler=scaler)

    def backward(loss: torch.Tensor) -> None:
        loss = loss / grad_accum
        (scaler.scale(loss) if scaler is not None else loss).backward()

    w.backward = backward
    w.step = partial(clip_and_step, w, list(model.parameters()), cfg.train.clip_grad_norm)
    w.sync = partial(_sync, model)
    w.lr = lambda: w.scheduler.get_last_lr()[0]
    w.extra.update(blocks=len(blocks), cpu_offload="offload_policy" in kwargs)
    return w
