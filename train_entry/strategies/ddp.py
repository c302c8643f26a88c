"""DDP: replicate the model, all-reduce gradients in buckets; no_sync on all but the last micro-step."""

from __future__ import annotations

import contextlib
import inspect
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from train_entry.optim import DTYPES, build_optimizer, build_scheduler
from train_entry.strategies import Wrapped, clip_and_step


def _comm_hook(model: DDP, cfg: Any) -> None:
    hook = cfg.ddp.comm_hook
    if hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "powersgd":
        # batched_powerSGD_hook fails on gloo (shared/notes/cpu-distributed.md); the layer-wise one works.
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=cfg.ddp.powersgd_rank,
                                   start_powerSGD_iter=2, random_seed=cfg.train.seed)
        model.register_comm_hook(state, psgd.powerSGD_hook)


def wrap(model: nn.Module, *, cfg: Any, device: torch.device, grad_accum: int) -> Wrapped:
    d = cfg.ddp
    # torch >= 2.13 renamed broadcast_buffers (per-forward buffer sync) to forward_sync_buffers
    buffers = ({"forward_sync_buffers": d.broadcast_buffers}
               if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
               else {"broadcast_buffers": d.broadcast_buffers})
    model = DDP(model.to(device), device_ids=[device.index] if device.type == "cuda" else None,
                bucket_cap_mb=d.bucket_cap_mb, gradient_as_bucket_view=d.gradient_as_bucket_view,
                static_graph=d.static_graph, find_unused_parameters=d.find_unused_parameters, **buffers)
    # Fix the bucket layout now, the same at every start. DDP otherwise rebuilds its buckets after the
    # first step in gradient-ready order, which moves gradients to other offsets of the ring all-reduce:
    # with more than 2 ranks that is another summation order, and a resumed run (first step again with
    # the initial layout) drifts from an uninterrupted one in the last bits. (Found by the 4-rank Slurm
    # preemption test; same call DDP makes itself in _update_process_group.)
    if not d.find_unused_parameters:
        model.reducer._push_all_rebuilt_params()
        model.reducer._rebuild_buckets()
    _comm_hook(model, cfg)
    optimizer = build_optimizer(model.parameters(), cfg)
    precision = cfg.train.precision
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    w = Wrapped(model=model, optimizer=optimizer, scheduler=build_scheduler(optimizer, cfg), scaler=scaler)

    def backward(loss: torch.Tensor) -> None:
        loss = loss / grad_accum
        (scaler.scale(loss) if scaler is not None else loss).backward()

    params = list(model.parameters())
    w.backward = backward
    w.step = partial(clip_and_step, w, params, cfg.train.clip_grad_norm)
    # Gradients are all-reduced only in the last micro-step's backward.
    w.sync = lambda last: contextlib.nullcontext() if last else model.no_sync()
    if precision != "fp32":
        w.autocast = partial(torch.autocast, device.type, dtype=DTYPES[precision])
    w.lr = lambda: w.scheduler.get_last_lr()[0]
    return w
