"""Tensor parallel: the model's TP plan (the user's `parallel.tp_plan`, an hf: model's own, or the
demo GPT's) on the
mesh's "tp" dimension, and the vocabulary-parallel loss around each micro-step."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import loss_parallel

from hpctrain.kernel import hffolder
from train_entry.config import TrainConfig
from train_entry.model import call_factory, load_object
from train_entry.parallel.gpt import tp_plan
from train_entry.pretrained import layout


def plan_of(cfg: TrainConfig) -> Callable[..., object]:
    """The TP plan function: the user's (config-checked to exist for a user model) or the demo's."""
    if cfg.parallel.tp_plan:
        return load_object(cfg.parallel.tp_plan, "parallel.tp_plan")
    if hffolder.folder_of(cfg.model.factory):
        return layout.tp_plan  # the architecture's own plan (transformers' base_model_tp_plan)
    return tp_plan


def apply(part: nn.Module, *, tp_mesh: DeviceMesh, cfg: TrainConfig) -> None:
    call_factory(plan_of(cfg), model=part, tp_mesh=tp_mesh, config=cfg)


def loss_context(cfg: TrainConfig) -> Callable[[], ContextManager[object]]:
    """loss_parallel() when the plan leaves the logits sharded on the vocabulary (forward and
    backward both run inside it); else nothing."""
    hf = hffolder.folder_of(cfg.model.factory) is not None  # its plan leaves the head replicated
    if cfg.parallel.tp > 1 and cfg.parallel.loss_parallel and not hf:
        return loss_parallel
    return contextlib.nullcontext
