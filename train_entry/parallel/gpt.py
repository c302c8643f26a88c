"""The demo GPT's tensor-parallel plan and pipeline split: the worked example for your own model.

Your model gets the same two functions, named in the config (docs/parallel.md):

    parallel:
      tp_plan: mypkg.parallel:tp_plan     # tp_plan(model, tp_mesh, config): parallelize in place
      pp_split: mypkg.parallel:pp_split   # pp_split(model, stage_ids, n_stages, config)
                                          #   -> (stage modules, loss_fn(output, target))

The TP plan is Megatron's: attention and MLP as column-then-row parallel pairs (one all-reduce each,
here a reduce-scatter because of sequence parallel), the norms sequence parallel (each rank holds a
slice of the tokens between the pairs), the embeddings vocabulary parallel, and the output layer
column parallel with the logits left sharded on the vocabulary for `loss_parallel`.

The split keeps the GPT's own parameter names (`blocks.3.qkv.weight` is that in every layout), so a
checkpoint saved with one layout loads into another. Stages reuse the model's modules (no copy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from train_entry.config import TrainConfig


def tp_plan(model: nn.Module, tp_mesh: DeviceMesh, config: TrainConfig) -> None:
    """Megatron-style TP + sequence parallel for the GPT (or one of its stages), in place."""
    sharded_logits = config.parallel.loss_parallel
    root: dict[str, ParallelStyle] = {}
    if getattr(model, "tok", None) is not None:  # the first stage: embeddings, tokens split
        root["tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
        root["pos"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0))
    if getattr(model, "head", None) is not None:  # the last stage: final norm and the logits
        root["ln_f"] = SequenceParallel()
        root["head"] = ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if sharded_logits else Replicate(),
            use_local_output=not sharded_logits,
        )
    if root:
        parallelize_module(model, tp_mesh, root)
    for block in _blocks(model):
        parallelize_module(
            block,
            tp_mesh,
            {
                "ln1": SequenceParallel(),
                "qkv": ColwiseParallel(input_layouts=Shard(1)),  # whole heads per rank
                "proj": RowwiseParallel(output_layouts=Shard(1)),
                "ln2": SequenceParallel(),
                "mlp.0": ColwiseParallel(input_layouts=Shard(1)),
                "mlp.2": RowwiseParallel(output_layouts=Shard(1)),
            },
        )


def _blocks(model: nn.Module) -> list[nn.Module]:
    # nn.Module.__getattr__ is typed Tensor | Module; a GPT's blocks are a ModuleList or ModuleDict
    blocks = cast(nn.ModuleList | nn.ModuleDict, model.blocks)
    return list(blocks.values() if isinstance(blocks, nn.ModuleDict) else blocks)


class GPTStage(nn.Module):
    """Layers [lo, hi) of a GPT, under the GPT's own names; the first stage embeds the tokens,
    the last returns the logits."""

    def __init__(self, gpt: nn.Module, lo: int, hi: int, *, first: bool, last: bool) -> None:
        super().__init__()
        # nn.Module.__getattr__ is typed Tensor | Module: these are the GPT's submodules
        blocks = cast(nn.ModuleList, gpt.blocks)
        self.tok: nn.Module | None = cast(nn.Module, gpt.tok) if first else None
        self.pos: nn.Module | None = cast(nn.Module, gpt.pos) if first else None
        self.blocks = nn.ModuleDict({str(i): blocks[i] for i in range(lo, hi)})
        self.ln_f: nn.Module | None = cast(nn.Module, gpt.ln_f) if last else None
        self.head: nn.Module | None = cast(nn.Module, gpt.head) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None:
            assert self.pos is not None
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None:
            assert self.ln_f is not None
            x = self.head(self.ln_f(x)).float()
        return x


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The GPT's loss on the last stage's logits (the same as GPT.forward computes)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def pp_split(
    model: nn.Module, stage_ids: list[int], n_stages: int, config: TrainConfig
) -> tuple[list[nn.Module], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """Equal runs of layers per stage; this rank's stages (its `stage_ids`) and the loss."""
    n = len(model.blocks)  # type: ignore[arg-type]
    per = n // n_stages
    stages: list[nn.Module] = [
        GPTStage(model, s * per, (s + 1) * per, first=s == 0, last=s == n_stages - 1)
        for s in stage_ids
    ]
    return stages, loss_fn
