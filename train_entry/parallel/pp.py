"""Pipeline parallel: split the model into stages (the user's `parallel.pp_split`, an hf: model's
decoder layers, or the demo GPT's), keep on this rank only what its stages use, and run a torch.distributed.pipelining
schedule (GPipe, 1F1B, interleaved 1F1B) over the mesh's "pp" dimension.

Stages are assigned like torchtitan's: rank r holds stage r (and r + pp with interleaving).
Every rank first builds the whole model (same seed, so the same initial values as a run without
pp); the layers of other stages are dropped before any sharding. An hf: model is built on the
meta device and each rank loads only its stages' tensors (train_entry/pretrained/).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed import ProcessGroup

from hpctrain.kernel import hffolder
from hpctrain.kernel import mesh as layouts
from hpctrain.kernel.errors import UserError
from train_entry.config import TrainConfig
from train_entry.model import call_factory, load_object
from train_entry.parallel import gpt
from train_entry.pretrained import layout

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # loss_fn(output, target)


def stage_ids(pp_rank: int, pp: int, schedule: str) -> list[int]:
    v = layouts.stages_per_rank(schedule)
    return [pp_rank + i * pp for i in range(v)]


def split(model: nn.Module, *, pp_rank: int, cfg: TrainConfig) -> tuple[list[nn.Module], Loss]:
    par = cfg.parallel
    ids = stage_ids(pp_rank, par.pp, par.schedule)
    n = par.pp * layouts.stages_per_rank(par.schedule)
    fn = load_object(par.pp_split, "parallel.pp_split") if par.pp_split else gpt.pp_split
    what = par.pp_split or "the demo GPT's split"
    if not par.pp_split and hffolder.folder_of(cfg.model.factory):
        fn, what = layout.pp_split, "the decoder's split (model.model.layers)"
    out = call_factory(fn, model=model, stage_ids=ids, n_stages=n, config=cfg)
    if not (isinstance(out, tuple) and len(out) == 2 and callable(out[1])):
        raise UserError(
            f"parallel.pp_split {what} returned {type(out).__name__}; return "
            "(list of this rank's stage modules, loss_fn(output, target))"
        )
    parts, loss = list(out[0]), out[1]
    if len(parts) != len(ids) or not all(isinstance(p, nn.Module) for p in parts):
        raise UserError(
            f"parallel.pp_split {what} returned {len(parts)} stage(s) for stage_ids {ids}; "
            "return one nn.Module per stage id, in that order"
        )
    _keep_only(model, parts)
    return parts, loss


def _keep_only(model: nn.Module, parts: list[nn.Module]) -> None:
    """Drop from `model` the parameters and buffers no stage of this rank uses, so the model (with
    its own names) holds exactly this rank's share: its state dict is this rank's checkpoint."""
    keep = {id(t) for p in parts for t in (*p.parameters(), *p.buffers())}
    for m in model.modules():
        for table in (m._parameters, m._buffers):
            for name in [k for k, t in table.items() if t is not None and id(t) not in keep]:
                del table[name]


SCHEDULES = {  # config name -> the torch.distributed.pipelining class
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved_1f1b": "ScheduleInterleaved1F1B",
}


class Pipeline:
    """This rank's stages and the schedule: `run(batch)` is one micro-step (the schedule cuts it
    into microbatches and runs forward and backward of all of them)."""

    def __init__(
        self,
        parts: list[nn.Module],
        *,
        loss: Loss,
        pp_rank: int,
        pp_group: ProcessGroup,
        device: torch.device,
        cfg: TrainConfig,
        grad_accum: int,
    ) -> None:
        from torch.distributed import pipelining  # lazy: 4 s of imports (torch._dynamo), pp only

        par = cfg.parallel
        self.ids = stage_ids(pp_rank, par.pp, par.schedule)
        n = par.pp * layouts.stages_per_rank(par.schedule)
        self.first, self.last = 0 in self.ids, n - 1 in self.ids
        self.accum = grad_accum
        stages = [
            pipelining.PipelineStage(part, sid, n, device, group=pp_group)
            for part, sid in zip(parts, self.ids, strict=True)
        ]
        cls = getattr(pipelining, SCHEDULES[par.schedule])
        m = par.microbatches or par.pp
        # The loss of one microbatch is its mean. With one micro-step per optimizer step the
        # schedule divides the gradients by the m microbatches (scale_grads). With accumulation it
        # must not: it would divide the gradients already accumulated again at every micro-step;
        # the loss is divided by accum x m instead, and the mean over the step comes out the same.
        self.scale, self.loss = (1 if grad_accum == 1 else grad_accum * m), loss
        self.schedule = cls(
            stages if len(stages) > 1 else stages[0],
            n_microbatches=m,
            loss_fn=self._loss,
            scale_grads=grad_accum == 1,
        )

    def _loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        value = self.loss(out, target)
        return value if self.scale == 1 else value / self.scale

    def run(self, batch: object) -> torch.Tensor | None:
        """One micro-step; the mean loss on the rank holding the last stage, else None."""
        inputs, target = _split_batch(batch)
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.first else ()
        kwargs = {"target": target, "losses": losses} if self.last else {}
        self.schedule.step(*args, **kwargs)
        if not self.last:
            return None
        total = torch.stack([_plain(x).detach().float() for x in losses]).mean()
        return total * self.scale


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _split_batch(batch: object) -> tuple[object, object]:
    """(input of the first stage, target of the loss): a dict's first entry and its 'targets' or
    'labels'; a tuple or list's two items."""
    if isinstance(batch, dict):
        target_key = next((k for k in ("targets", "labels") if k in batch), None)
        rest = [k for k in batch if k != target_key]
        if target_key is None or len(rest) != 1:
            raise UserError(
                f"pipeline parallel needs a batch of one input and its target; got keys "
                f"{sorted(batch)}: return {{'<input>': x, 'targets': y}} (or 'labels')"
            )
        return batch[rest[0]], batch[target_key]
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return batch[0], batch[1]
    raise UserError(
        "pipeline parallel needs a batch of one input and its target: a dict "
        "{'<input>': x, 'targets': y} or a pair (x, y)"
    )
