"""The strategy of a run with tp and/or pp: one DeviceMesh, the model cut and sharded in a fixed
order, FSDP2 (the run's data-parallel strategy) over the mesh's dp dimension. The dimensions
themselves (the mesh, tp, pp, the demo GPT's plan and split) are in train_entry/parallel/.

Order (torchtitan's): 1. split into pipeline stages (this rank keeps its stages' layers),
then per stage 2. the TP plan, 3. activation checkpointing, 4. compile, 5. fully_shard over dp.
TP comes before FSDP because FSDP2 shards the DTensors TP made (2D: dp x tp); checkpointing and
compile act on the blocks the plan has already rewritten.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from contextlib import ExitStack

import torch
import torch.distributed as dist
from torch import nn

from train_entry.config import TrainConfig
from train_entry.model import apply_activation_checkpointing, apply_compile, compute_loss, on_meta
from train_entry.optim import build_optimizer, build_scheduler
from train_entry.parallel import pp, tp
from train_entry.parallel.dims import ParallelDims
from train_entry.state import _canonical, _full, digest
from train_entry.strategies.base import Strategy
from train_entry.strategies.fsdp import FSDPStrategy


class ParallelStrategy(Strategy):
    """DP (FSDP2) x TP x PP on one mesh. `model` is this rank's share of the user's model under
    its own parameter names (what the checkpoint saves); `parts` its pipeline stages."""

    name = "mesh"
    # set by build()
    parts: list[nn.Module]
    dims: ParallelDims
    cfg: TrainConfig
    max_norm: float | None
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    loss_context: Callable[[], ContextManager[object]]
    pipeline: pp.Pipeline | None

    @classmethod
    def build(
        cls,
        model: nn.Module,
        *,
        cfg: TrainConfig,
        device: torch.device,
        grad_accum: int,
        dims: ParallelDims,
        dp_strategy: type[FSDPStrategy],
    ) -> ParallelStrategy:
        par = cfg.parallel
        # 1. pipeline stages: this rank's, the rest of the model dropped
        loss: pp.Loss | None = None
        if par.pp > 1:
            parts, loss = pp.split(model, pp_rank=dims.pp_rank, cfg=cfg)
        else:
            parts = [model]
        if not on_meta(model):  # meta: an hf: model, loaded once sharded (train_entry/pretrained/)
            model.to(device)
        blocks = 0
        for part in parts:
            # 2. tensor parallel (DTensor parameters on mesh["tp"])
            if par.tp > 1:
                tp.apply(part, tp_mesh=dims.sub("tp"), cfg=cfg)
            # 3. activation checkpointing, 4. compile, per block
            if cfg.train.activation_checkpointing:
                apply_activation_checkpointing(part, block_class=cfg.fsdp.block_class)
            if cfg.train.compile:
                apply_compile(part, block_class=cfg.fsdp.block_class)
            # 5. data parallel over mesh["dp"]: every block, then the stage as the root
            blocks += dp_strategy.shard(part, cfg=cfg, device=device, mesh=dims.sub("dp"))
        optimizer = build_optimizer(model.parameters(), cfg)
        s = cls(
            model,
            optimizer,
            build_scheduler(optimizer, cfg),
            None,
            device=device,
            grad_accum=grad_accum,
            extra={"mesh": dims.describe(), "blocks": blocks, "stages": len(parts)},
        )
        s.parts, s.dims, s.cfg = parts, dims, cfg
        s.max_norm, s.params = cfg.train.clip_grad_norm, list(model.parameters())
        s.loss_context = tp.loss_context(cfg)
        s.pipeline = None
        if loss is not None:  # pp > 1
            s.pipeline = pp.Pipeline(
                parts,
                loss=loss,
                pp_rank=dims.pp_rank,
                pp_group=dims.sub("pp").get_group(),
                device=device,
                cfg=cfg,
                grad_accum=grad_accum,
            )
        return s

    # ---- one micro-step
    def micro_step(self, batch: object, last: bool) -> torch.Tensor:
        with ExitStack() as stack:
            stack.enter_context(self.autocast())
            stack.enter_context(self.loss_context())
            if self.pipeline is not None:
                # the schedule syncs FSDP's gradients itself at the end of each run
                loss = self.pipeline.run(batch)
                if loss is None:  # no last stage here: nothing to count
                    return torch.zeros((), device=self.device)
                # only 1 in pp ranks holds a loss: weigh it so the step's sum over all ranks
                # divided by the world size is the mean over data-parallel ranks
                return loss * self.dims.layout.pp
            stack.enter_context(self.sync(last))
            loss = compute_loss(self.model, batch)
            self.backward(loss)
        return _plain(loss).detach().float()

    def sync(self, last: bool) -> ContextManager[object]:
        for part in self.parts:
            part.set_requires_gradient_sync(last)  # type: ignore[operator]
        return ExitStack()

    def step(self) -> float:
        """Clip over every stage (the norm's squares summed over pp), step, advance the schedule."""
        norm = float("nan")
        if self.max_norm is not None:
            grads = [p.grad for p in self.params if p.grad is not None]
            total = _plain(torch.nn.utils.get_total_norm(grads, foreach=True))
            if self.pipeline is not None:
                total = total**2
                dist.all_reduce(total, group=self.dims.sub("pp").get_group())
                total = total.sqrt()
            torch.nn.utils.clip_grads_with_norm_(self.params, self.max_norm, total, foreach=True)
            norm = float(total)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return norm

    def params_sha256(self) -> str:
        """The same digest as a run without pp (state.params_sha256): with pp, every stage's full
        parameters are gathered over the pp group first (a collective on every rank)."""
        local = {_canonical(n): _full(p).cpu() for n, p in self.model.named_parameters()}
        if self.pipeline is not None:
            everyone: list[dict[str, torch.Tensor]] = [{}] * self.dims.layout.pp
            dist.all_gather_object(everyone, local, group=self.dims.sub("pp").get_group())
            local = {k: v for part in everyone for k, v in part.items()}
        return digest(sorted(local.items()))


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t
