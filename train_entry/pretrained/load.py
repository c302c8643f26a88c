"""Materialize a meta-built model and read each rank's share of the folder's safetensors.

A plain parameter (DDP, DeepSpeed, a pipeline stage without FSDP) reads the whole tensor; a DTensor
(FSDP2's dp shard, TP's Shard(0)/Shard(1), both on a 2D mesh) reads only its local block: torch's
own `compute_local_shape_and_global_offset` (through compat) says which rows and columns. Whole rows (FSDP2's
shards, TP's column-wise ones, whole tensors) are read with one pread straight into the
parameter's memory, or through one buffer of the stored dtype when it is cast (bf16 files into
float32 master weights): no mapping of the file, so a rank's resident memory grows by its share
only. TP's row-wise column blocks go through safetensors' `get_slice(name)[rows, cols]`, which
reads just those bytes. One tensor is in flight at a time.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.tensor import DTensor

from hpctrain.kernel import hffolder
from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.errors import UserError
from train_entry.compat import local_shape_and_offset
from train_entry.config import TrainConfig
from train_entry.parallel.dims import ParallelDims
from train_entry.pretrained.build import folder_of

# safetensors' dtype names, where a rank can read the bytes as they are (a little-endian host)
DTYPES = (
    {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
    if sys.byteorder == "little"
    else {}
)
_SAME_WIDTH = {
    torch.float32: torch.float32,
    torch.float64: torch.float64,
    torch.float16: torch.float16,
    torch.bfloat16: torch.int16,
}
_WRAPPERS = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


def _name(fqn: str) -> str:
    for w in _WRAPPERS:
        fqn = fqn.replace(w, "")
    return fqn


@contextlib.contextmanager
def _swapping() -> Iterator[None]:
    # to_empty swaps each tensor into the same Parameter object: the optimizer and the strategy
    # were built on these objects before they had memory, and keep working on them
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


def _block(t: torch.Tensor) -> tuple[slice, ...] | None:
    """This rank's rows/columns of `t` in the full tensor; None when it holds all of it."""
    if not isinstance(t, DTensor):
        return None
    shape, offset = local_shape_and_offset(t)
    return tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))


class _Files:
    """Open safetensors files, one handle each, closed together."""

    def __init__(self, folder: hffolder.Folder) -> None:
        self.folder, self.open = folder, dict[Path, Any]()  # Any: safetensors' handle is untyped

    def into(self, name: str, block: tuple[slice, ...] | None, local: torch.Tensor) -> bool:
        """Read rows [a, b) with one pread (no mapping of the file) when that is what this rank
        holds: whole rows of a contiguous parameter. Straight into `local` when it is host
        memory of the stored dtype; else into one host buffer of the stored dtype, then copied
        (cast, to the GPU) into `local`. False when it is not
        whole rows (TP's row-wise column blocks): then `slice` reads it."""
        t = self.folder.tensors[name]
        stored = DTYPES.get(t.dtype)
        if stored is None or not local.is_contiguous() or not t.shape:
            return False
        if block is not None and any(
            s != slice(0, n) for s, n in zip(block[1:], t.shape[1:], strict=True)
        ):
            return False
        direct = stored == local.dtype and local.device.type == "cpu"
        target = local if direct else torch.empty(local.shape, dtype=stored)  # then cast/moved
        row = target.element_size() * math.prod(t.shape[1:])
        first = block[0].start if block is not None else 0
        # bytes, as numpy sees any dtype (bf16 has no numpy type: read it as int16)
        array = target.detach().view(_SAME_WIDTH[stored]).numpy()
        view = memoryview(array).cast("B")  # type: ignore[arg-type]  # numpy arrays are buffers
        with open(t.file, "rb", buffering=0) as f:
            f.seek(t.offset + first * row)
            got = f.readinto(view) if local.numel() else 0
        if got != local.numel() * target.element_size():
            raise UserError(f"{t.file}: {name}: the file ends early (truncated?)")
        if target is not local:
            local.copy_(target)
        return True

    def slice(self, name: str, block: tuple[slice, ...] | None) -> torch.Tensor:
        t = self.folder.tensors[name]
        if t.file not in self.open:
            self.open[t.file] = safe_open(str(t.file), framework="pt", device="cpu")
        piece = self.open[t.file].get_slice(name)
        out: torch.Tensor = piece[block] if block is not None else piece[:]
        return out


def _check_shapes(model: nn.Module, folder: hffolder.Folder) -> None:
    """Every parameter and persistent buffer in the files with the model's shape: one line each."""
    wrong, missing = [], []
    for fqn, t in model.state_dict(keep_vars=True).items():
        name = _name(fqn)
        if name not in folder.tensors:
            if name not in _tied(model):
                missing.append(name)
            continue
        stored = folder.tensors[name]
        if tuple(t.shape) != stored.shape:
            wrong.append(
                f"{stored.file}: {name}: shape {list(stored.shape)}, the model built from "
                f"{folder.path / hffolder.CONFIG} has {list(t.shape)}"
            )
    if missing:
        wrong.append(
            f"{folder.path}: {missing[0]}: not in the folder's safetensors"
            + (f" ({len(missing) - 1} more missing)" if len(missing) > 1 else "")
        )
    if wrong:
        raise UserError("\n".join(wrong))


def _tied(model: nn.Module) -> set[str]:
    """Names whose tensor is another's (lm_head.weight under tie_word_embeddings)."""
    keys = getattr(model, "_tied_weights_keys", None)
    config = getattr(model, "config", None)
    if not isinstance(keys, dict) or not getattr(config, "tie_word_embeddings", False):
        return set()
    return {str(k) for k in keys}


def materialize(model: nn.Module, folder: hffolder.Folder, device: torch.device) -> int:
    """Give the meta model memory on `device` and fill it from the folder; returns the bytes read."""
    _check_shapes(model, folder)
    with _swapping():
        model.to_empty(device=device)
    read = 0
    files = _Files(folder)
    tied = _tied(model)
    with torch.no_grad():
        seen: set[int] = set()
        for fqn, t in model.state_dict(keep_vars=True).items():
            name = _name(fqn)
            if id(t) in seen or name not in folder.tensors:
                continue  # a tied tensor is filled once
            seen.add(id(t))
            block = _block(t)
            local = t.to_local() if isinstance(t, DTensor) else t
            if not files.into(name, block, local):
                piece = files.slice(name, block)
                if tuple(local.shape) != tuple(piece.shape):
                    raise UserError(
                        f"{folder.tensors[name].file}: {name}: read {list(piece.shape)} for "
                        f"this rank, its share is {list(local.shape)}"
                    )
                local.copy_(piece)
            read += local.numel() * local.element_size()
        _buffers(model)
    files.open.clear()
    for name in tied:
        _retie(model, name)
    return read


def _buffers(model: nn.Module) -> None:
    """The non-persistent buffers (rotary inv_freq): not in the files, garbage after to_empty;
    recomputed by the model's own init of the modules that own them (transformers'
    `_init_weights`, which computes the rope frequencies from the config)."""
    init = getattr(model, "_init_weights", None)
    for module in model.modules():
        if module._non_persistent_buffers_set and not any(True for _ in module.parameters()):
            if init is None:
                raise UserError(
                    f"{type(model).__name__} has non-persistent buffers and no _init_weights "
                    "to compute them"
                )
            init(module)


def _retie(model: nn.Module, name: str) -> None:
    """After to_empty a tied pair must still be one tensor (swap keeps it; say it if not)."""
    target = getattr(model, "_tied_weights_keys", {}).get(name)
    a, b = model.get_parameter(name), model.get_parameter(str(target))
    if a is not b:
        tie = getattr(model, "tie_weights", None)
        if tie is None:
            raise UserError(f"{name} and {target} are no longer tied after loading")
        tie()


class Loader:
    """When an hf: model gets its weights: before the strategy wraps it when every rank holds the
    whole model (DDP; DeepSpeed ZeRO 0-3, which partitions what it is given), after it when the
    layout shards it (FSDP2, the mesh: each rank reads only its DTensor blocks)."""

    def __init__(self, model: nn.Module, folder: hffolder.Folder, device: torch.device) -> None:
        self.model, self.folder, self.device = model, folder, device

    @classmethod
    def of(
        cls, model: nn.Module, cfg: TrainConfig, dims: ParallelDims, *, device: torch.device
    ) -> Loader | None:
        """None for any other model, and for a whole-model layout (loaded here and now); else
        the loader to call once the strategy has sharded the model."""
        path = folder_of(model)
        if path is None:
            return None
        info = strategy_names.info(cfg.strategy)
        load = cls(model, hffolder.read(path), device)
        if dims.mesh is None and not (info.sharded and not info.zero):
            load()
            return None
        return load

    def __call__(self) -> None:
        materialize(self.model, self.folder, self.device)
