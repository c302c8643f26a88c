"""Tensor and pipeline parallel for YOUR model: the worked example (the demo GPT, plan and split).

train_entry needs two functions from a model it does not know, named in the config next to the
model factory (docs/parallel.md):

    hpctrain submit --profile local --nodes 2 --gpus 4 --name tp-pp -- --strategy fsdp \\
        --model.factory examples.gpt_parallel:model \\
        --parallel.tp 2 --parallel.tp_plan examples.gpt_parallel:tp_plan \\
        --parallel.pp 2 --parallel.pp_split examples.gpt_parallel:pp_split

- `tp_plan(model, tp_mesh, config)` rewrites the model in place for tensor parallel, with
  `parallelize_module` and a plan per submodule (called on each pipeline stage when pp > 1: skip
  what the stage does not hold).
- `pp_split(model, stage_ids, n_stages, config)` returns this rank's stage modules, one per id, and
  the loss `loss_fn(output, target)` the last stage's output goes into. Stages REUSE the model's
  submodules (no copy) and keep its parameter NAMES: that is what lets a checkpoint saved with one
  layout load into another (dp 4, tp 2 x pp 2, ...). train_entry drops, on each rank, the
  parameters no stage of that rank uses.

train_entry applies them in torchtitan's order: split, then per stage the TP plan, activation
checkpointing, compile, and FSDP2 over the data-parallel ranks. Batches for a pipeline are a dict of
one input and `targets` (or `labels`), or an (input, target) pair.

This file is the same plan and split train_entry uses for its built-in demo GPT
(train_entry/parallel/gpt.py); tests/test_parallel_layouts.py trains with both and checks they agree.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from train_entry.config import TrainConfig
from train_entry.model import GPT


def model(config: TrainConfig) -> nn.Module:
    """Your model factory (here the demo GPT, built from the config's model section)."""
    m = config.model
    return GPT(
        vocab_size=m.vocab_size,
        d_model=m.d_model,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        seq_len=m.seq_len,
        dropout=m.dropout,
    )


def tp_plan(model: GPT | Stage, tp_mesh: DeviceMesh, config: TrainConfig) -> None:
    """Megatron's layout with sequence parallel. Between blocks every rank holds 1/tp of the
    tokens (Shard(1)); each attention and MLP gathers them (the Colwise input), computes its share of
    heads / hidden units, and reduce-scatters back (the Rowwise output). Norms run on the token
    shard (SequenceParallel). The logits stay sharded on the vocabulary (Shard(-1)) so the loss
    runs under loss_parallel (parallel.loss_parallel, on by default) without gathering them."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    sharded_logits = config.parallel.loss_parallel
    root: dict[str, ParallelStyle] = {}
    if getattr(model, "tok", None) is not None:  # a stage with the embeddings
        root["tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
        root["pos"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0))
    if getattr(model, "head", None) is not None:  # a stage with the output layer
        root["ln_f"] = SequenceParallel()
        root["head"] = ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if sharded_logits else Replicate(),
            use_local_output=not sharded_logits,
        )
    if root:
        parallelize_module(model, tp_mesh, root)
    blocks = model.blocks  # a ModuleList in the model, a ModuleDict in a stage
    for block in blocks.values() if isinstance(blocks, nn.ModuleDict) else blocks:
        parallelize_module(
            block,
            tp_mesh,
            {
                "ln1": SequenceParallel(),
                # qkv's features are head-major, so a column split gives each rank whole heads
                "qkv": ColwiseParallel(input_layouts=Shard(1)),
                "proj": RowwiseParallel(output_layouts=Shard(1)),
                "ln2": SequenceParallel(),
                "mlp.0": ColwiseParallel(input_layouts=Shard(1)),
                "mlp.2": RowwiseParallel(output_layouts=Shard(1)),
            },
        )


class Stage(nn.Module):
    """Layers [lo, hi) under the model's own names; the first stage embeds, the last returns
    logits. Attributes a stage does not hold are None, so names never shift."""

    def __init__(self, gpt: GPT, lo: int, hi: int, *, first: bool, last: bool) -> None:
        super().__init__()
        self.tok = gpt.tok if first else None
        self.pos = gpt.pos if first else None
        self.blocks = nn.ModuleDict({str(i): gpt.blocks[i] for i in range(lo, hi)})
        self.ln_f = gpt.ln_f if last else None
        self.head = gpt.head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None and self.pos is not None:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None and self.ln_f is not None:
            x = self.head(self.ln_f(x)).float()
        return x


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def pp_split(
    model: GPT, stage_ids: list[int], n_stages: int, config: TrainConfig
) -> tuple[list[nn.Module], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """Equal runs of layers per stage (the config check makes n_stages divide the layers)."""
    if len(model.blocks) % n_stages:
        raise ValueError(f"{n_stages} stages do not divide {len(model.blocks)} layers")
    per = len(model.blocks) // n_stages
    stages: list[nn.Module] = [
        Stage(model, s * per, (s + 1) * per, first=s == 0, last=s == n_stages - 1)
        for s in stage_ids
    ]
    return stages, loss_fn
