"""The tensor-parallel plan and the pipeline split of a transformers decoder (hf: models).

TP: the architecture's own plan (`base_model_tp_plan`, e.g. Llama's and Qwen2's: q/k/v and
gate/up column-wise, o_proj and down_proj row-wise) on the base model (`model.model`), its strings
mapped to torch's styles. Attention then holds num_heads / tp heads per rank (transformers reshapes
by head_dim, so the local heads follow), one all-reduce after o_proj and one after down_proj. The
embeddings, norms and head stay whole on every tp rank (Replicate DTensors; FSDP2 shards them over
dp), so the logits are whole too and the loss needs no loss_parallel.

PP: model.model.layers cut into equal runs; the first stage embeds, every stage computes the rotary
embeddings (a buffer, no parameters), the last applies the final norm and the head; the loss is
transformers' causal-LM loss (labels shifted by one, -100 ignored).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from hpctrain.kernel import hffolder
from hpctrain.kernel.errors import UserError
from train_entry.config import TrainConfig

STYLES: dict[str, Callable[[], ParallelStyle]] = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
}
assert tuple(STYLES) == hffolder.TP_STYLES


def tp_styles(config: object, where: Path | None = None) -> dict[str, ParallelStyle]:
    """The architecture's plan as torch styles; UserError (one line) when it has none or uses a
    style this does not map."""
    plan = getattr(config, "base_model_tp_plan", None)
    at = f"{where / hffolder.CONFIG}" if where else type(config).__name__
    arch = type(config).__name__
    if not isinstance(plan, Mapping) or not plan:
        raise UserError(
            f"{at}: base_model_tp_plan: {arch} has no tensor-parallel plan in transformers; "
            "use --parallel.tp 1 (FSDP shards it), or set parallel.tp_plan to your own"
        )
    unknown = sorted({str(v) for v in plan.values()} - set(STYLES))
    if unknown:
        raise UserError(
            f"{at}: base_model_tp_plan: {arch}'s plan uses {', '.join(unknown)}, which hpctrain "
            f"does not map (it maps {', '.join(STYLES)}); use --parallel.tp 1"
        )
    return {str(k): STYLES[str(v)]() for k, v in plan.items()}


def tp_plan(model: nn.Module, tp_mesh: DeviceMesh, config: TrainConfig) -> None:
    """The plan on the base model (or a pipeline stage, which holds the same `layers`), then every
    other parameter replicated over tp (_replicate_rest)."""
    base = cast(nn.Module, getattr(model, "model", model))
    styles = tp_styles(model.config)
    parallelize_module(base, tp_mesh, styles)
    _replicate_rest(model, tp_mesh)


def _replicate_rest(root: nn.Module, tp_mesh: DeviceMesh) -> None:
    """The parameters the plan leaves alone (embeddings, norms, head) as Replicate DTensors on the
    tp mesh, their modules fed and answering plain tensors: then every parameter lives on the same
    2D (dp, tp) mesh after FSDP2, which the gradient norm's clipping needs (it stacks the norms of
    all of them). A tied pair stays one parameter."""
    done: dict[int, nn.Parameter] = {}
    for module in root.modules():
        own = [
            (n, p)
            for n, p in module._parameters.items()
            if p is not None and not isinstance(p, DTensor)
        ]
        for n, p in own:
            if id(p) not in done:
                spread = distribute_tensor(p.data, tp_mesh, [Replicate()])
                done[id(p)] = nn.Parameter(spread, requires_grad=p.requires_grad)
            module.register_parameter(n, done[id(p)])
        if own:
            module.register_forward_pre_hook(partial(_replicated_in, tp_mesh))
            module.register_forward_hook(_local_out)


def _replicated_in(
    mesh: DeviceMesh, module: nn.Module, args: tuple[object, ...]
) -> tuple[object, ...]:
    return tuple(
        DTensor.from_local(a, mesh, [Replicate()], run_check=False)
        if isinstance(a, torch.Tensor) and not isinstance(a, DTensor)
        else a
        for a in args
    )


def _local_out(module: nn.Module, args: object, out: object) -> object:
    return out.to_local() if isinstance(out, DTensor) else out


class Stage(nn.Module):
    """Layers [lo, hi) of a causal LM; submodules are the model's own (no copy)."""

    def __init__(self, lm: nn.Module, lo: int, hi: int, *, first: bool, last: bool) -> None:
        super().__init__()
        base = cast(nn.Module, lm.model)
        layers = cast(nn.ModuleList, base.layers)
        self.config = lm.config
        self.embed_tokens = cast(nn.Module, base.embed_tokens) if first else None
        self.rotary_emb = cast(nn.Module, base.rotary_emb)
        self.layers = nn.ModuleDict({str(i): layers[i] for i in range(lo, hi)})
        self.norm = cast(nn.Module, base.norm) if last else None
        self.lm_head = cast(nn.Module, lm.lm_head) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        rope = self.rotary_emb(x, positions)
        for layer in self.layers.values():
            out = layer(x, position_embeddings=rope, position_ids=positions)
            x = out[0] if isinstance(out, tuple) else out
        if self.norm is not None and self.lm_head is not None:
            x = self.lm_head(self.norm(x)).float()
        return x


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers' ForCausalLMLoss: position t predicts labels[t + 1]; -100 is ignored."""
    return F.cross_entropy(
        logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
    )


def pp_split(
    model: nn.Module, stage_ids: list[int], n_stages: int, config: TrainConfig
) -> tuple[list[nn.Module], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    base = cast(nn.Module, model.model)  # a causal LM: its decoder
    layers = cast(nn.ModuleList, base.layers)
    per = len(layers) // n_stages
    stages: list[nn.Module] = [
        Stage(model, s * per, (s + 1) * per, first=s == 0, last=s == n_stages - 1)
        for s in stage_ids
    ]
    return stages, causal_lm_loss
