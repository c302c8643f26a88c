"""The demo GPT, loading user models, and what is applied per block (checkpointing, compile).

Loss protocol for your own model (`--model pkg.module:factory`):
  - the factory is called with the keyword arguments it names among `config` (the TrainConfig),
    `rank` and `world_size`, and returns an `nn.Module`;
  - the trainer calls `model(**batch)` when a batch is a dict (Hugging Face style), else `model(batch)`;
  - forward returns the mean loss as a scalar tensor, or an object/dict with a `loss` entry.
`--model hf:<folder>` is a Hugging Face folder: the model is built on the meta device and loaded
after the layout is applied (train_entry/pretrained/, docs/finetune.md).
Blocks for FSDP sharding and activation checkpointing are the children of the model's ModuleLists,
or the modules whose class is named by `fsdp.block_class`.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hpctrain.kernel import hffolder
from hpctrain.kernel.errors import UserError
from train_entry.config import TrainConfig
from train_entry.pretrained import build as pretrained


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then an MLP."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.head_dim, self.dropout = d_model // n_heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # qkv's features are head-major ([q k v] of head 0, then head 1, ...), so a column split of
        # qkv under tensor parallel gives each rank whole heads: -1 is this rank's number of heads.
        # (b, t) from qkv's output: under sequence parallel x holds only this rank's tokens.
        h = self.qkv(self.ln1(x))
        b, t = h.shape[:2]
        q, k, v = h.view(b, t, -1, 3, self.head_dim).unbind(3)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            dropout_p=self.dropout if self.training else 0.0,
        )
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, -1)))
        out: torch.Tensor = x + self.drop(self.mlp(self.ln2(x)))
        return out


class GPT(nn.Module):
    def __init__(
        self,
        *,
        vocab_size: int,
        d_model: int,
        n_layers: int,
        n_heads: int,
        seq_len: int,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, dropout) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x)).float()
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


def demo_model(config: TrainConfig) -> nn.Module:
    m = config.model
    return GPT(
        vocab_size=m.vocab_size,
        d_model=m.d_model,
        n_layers=m.n_layers,
        n_heads=m.n_heads,
        seq_len=m.seq_len,
        dropout=m.dropout,
    )


def load_object(spec: str, what: str) -> Callable[..., object]:
    """'pkg.module:name' -> the object; a clear error when it is not there. 'hf:<folder>' -> the
    factory of a Hugging Face folder's model, on the meta device (train_entry/pretrained/)."""
    if hffolder.folder_of(spec) is not None:
        return pretrained.meta_model
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise UserError(f"{what} '{spec}' must look like 'pkg.module:factory'")
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise UserError(
            f"{what} '{spec}': cannot import {module} ({e}); check the name and PYTHONPATH"
        ) from None
    try:
        found: Callable[..., object] = getattr(mod, name)
        return found
    except AttributeError:
        raise UserError(f"{what} '{spec}': {module} has no attribute '{name}'") from None


def call_factory(fn: Callable[..., object], **available: object) -> object:
    """Call fn with the keyword arguments it names (config, rank, world_size)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return fn(**available)
    return fn(**{k: v for k, v in available.items() if k in params})


def build_model(config: TrainConfig, *, rank: int, world_size: int) -> nn.Module:
    # Same seed on every rank: FSDP2 shards each rank's own copy, so initial values must agree. In a
    # forked RNG, so the per-rank generators (dropout) keep their (seed, rank) state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.train.seed)
        if config.model.factory is None:
            return demo_model(config)
        model = call_factory(
            load_object(config.model.factory, "model.factory"),
            config=config,
            rank=rank,
            world_size=world_size,
        )
    if not isinstance(model, nn.Module):
        raise UserError(
            f"model.factory '{config.model.factory}' returned {type(model).__name__}, "
            f"not an nn.Module"
        )
    return model


def on_meta(model: nn.Module) -> bool:
    """Built without memory (an hf: model before its weights are loaded)."""
    return any(p.is_meta for p in model.parameters())


def compute_loss(model: Callable[..., object], batch: object) -> torch.Tensor:
    out = model(**batch) if isinstance(batch, dict) else model(batch)
    if isinstance(out, dict):
        out = out["loss"]
    elif not isinstance(out, torch.Tensor) and hasattr(out, "loss"):
        out = out.loss
    return cast(torch.Tensor, out)  # the loss protocol above


def find_blocks(model: nn.Module, block_class: str | None = None) -> list[nn.Module]:
    """The repeated blocks: modules of class `block_class`, else the children of every ModuleList
    or ModuleDict (a pipeline stage keeps its layers' names in a ModuleDict)."""
    if block_class:
        return [m for m in model.modules() if type(m).__name__ == block_class]
    return [
        child
        for m in model.modules()
        if isinstance(m, (nn.ModuleList, nn.ModuleDict))
        for child in m.children()
    ]


def apply_activation_checkpointing(model: nn.Module, *, block_class: str | None) -> int:
    """Recompute each block in backward. Overrides the instance's forward instead of wrapping the
    module, so parameter names (and so checkpoints) are the same with and without it."""
    blocks = find_blocks(model, block_class)
    for block in blocks:
        inner = block.forward
        block.forward = lambda *a, _f=inner, **k: checkpoint(_f, *a, use_reentrant=False, **k)
    return len(blocks)


def apply_compile(model: nn.Module, *, block_class: str | None) -> None:
    # Per block (like torchtitan): blocks are identical, so one compiled graph is reused; names unchanged.
    for block in find_blocks(model, block_class) or [model]:
        block.compile()
