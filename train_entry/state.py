"""What must round-trip for an exact resume: TrainState, per-rank RNG state, the final params hash.

`params_sha256(model)` hashes the full value of every parameter in name-sorted order, the same way
for DDP, FSDP2 and DeepSpeed (ZeRO-3 included), so two runs of any strategy compare by one line.
It is a collective for FSDP2 and ZeRO-3: every rank must call it.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import numpy as np
import torch
import torch.distributed as dist
from numpy.typing import NDArray
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

# Prefixes a wrapper adds to parameter names; stripped so every strategy names a parameter alike.
_WRAPPER_PREFIXES = (
    "module.",
    "_orig_mod.",
    "_fsdp_wrapped_module.",
    "_checkpoint_wrapped_module.",
)


class Position(TypedDict, total=False):
    """The data position, world-size independent (global samples consumed in the epoch), so a
    DDP/FSDP checkpoint saved at W ranks resumes at W' ranks: {"epoch": e, "offset": samples};
    an iterable dataset's own state_dict() under "iterable"."""

    epoch: int
    offset: int
    iterable: object


class LoopState(TypedDict):
    """train_state.json: the loop's place (TrainState.loop_state)."""

    step: int
    epoch: int
    micro_step: NotRequired[int]
    data: NotRequired[Position]
    scheduler: NotRequired[dict[str, object] | None]
    scaler: NotRequired[dict[str, object] | None]


@dataclass
class TrainState:
    """Everything that must round-trip for an exact resume (see docs/design.md)."""

    # the wrapped model (DDP/FSDP module), or the DeepSpeed engine: the checkpointer calls its
    # save_checkpoint and load_checkpoint
    model: Any  # Any: the DeepSpeed engine's methods are untyped
    optimizer: torch.optim.Optimizer | None = None  # None for DeepSpeed (the engine owns it)
    scheduler: LRScheduler | None = None
    scaler: torch.amp.GradScaler | None = None
    step: int = 0  # optimizer steps completed
    epoch: int = 0
    micro_step: int = 0  # micro-steps done inside the current step (0 at boundaries)
    data: Position = field(default_factory=Position)
    config: dict[str, object] = field(default_factory=dict)  # the frozen resolved TrainConfig
    flat_optim: bool = False  # save the optimizer state flattened per parameter (mesh runs)

    def loop_state(self) -> LoopState:
        """The JSON part saved next to the weights (the scheduler and scaler go there too)."""
        return {
            "step": self.step,
            "epoch": self.epoch,
            "micro_step": self.micro_step,
            "data": self.data,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load_loop_state(self, saved: LoopState) -> None:
        self.step, self.epoch = int(saved["step"]), int(saved["epoch"])
        self.micro_step = int(saved.get("micro_step", 0))
        self.data = (saved.get("data") or Position()).copy()
        scheduler, scaler = saved.get("scheduler"), saved.get("scaler")
        if self.scheduler is not None and scheduler is not None:
            self.scheduler.load_state_dict(scheduler)
        if self.scaler is not None and scaler is not None:
            self.scaler.load_state_dict(scaler)


# ---------------------------------------------------------------- JSON that keeps tensors exact
def _encode(obj: object) -> object:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        return {
            "__tensor__": t.reshape(-1).view(torch.uint8).numpy().tobytes().hex(),
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
        }
    if isinstance(obj, np.ndarray):
        return {
            "__ndarray__": obj.tobytes().hex(),
            "dtype": obj.dtype.str,
            "shape": list(obj.shape),
        }
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: _encode(v) for k, v in obj.items()}
        return {"__items__": [[_encode(k), _encode(v)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v) for v in obj]
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    return obj


def _decode(obj: object) -> object:
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        raw = bytearray.fromhex(obj["__tensor__"])
        dtype = getattr(torch, obj["dtype"])
        flat = (
            torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        )
        return flat.view(dtype).reshape(obj["shape"]).clone()
    if "__ndarray__" in obj:
        arr = np.frombuffer(bytes.fromhex(obj["__ndarray__"]), dtype=np.dtype(obj["dtype"]))
        return arr.reshape(obj["shape"]).copy()
    if "__tuple__" in obj:
        return tuple(_decode(v) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_decode(k): _decode(v) for k, v in obj["__items__"]}
    return {k: _decode(v) for k, v in obj.items()}


def dumps(obj: object) -> str:
    """JSON that round-trips tensors, arrays, tuples and float values bit for bit."""
    return json.dumps(_encode(obj), indent=1, sort_keys=True, allow_nan=True)


def loads(text: str) -> Any:  # Any: JSON of any shape, as json.loads gives it
    return _decode(json.loads(text))


# ---------------------------------------------------------------- RNG, one file per rank
class RngState(TypedDict):
    """One rank's generators, in the types their own get_state functions give."""

    python: tuple[object, ...]
    numpy: dict[str, Any] | tuple[str, NDArray[np.uint32], int, int, float]
    torch: torch.Tensor
    cuda: NotRequired[list[torch.Tensor]]


def capture_rng() -> RngState:
    """This rank's generators: python, numpy, torch CPU and every CUDA device when present."""
    state: RngState = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: RngState) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:  # another GPU count: each rank uses one device, take the first saved state
            torch.cuda.set_rng_state(cuda[0])


# ---------------------------------------------------------------- the final params hash
def _canonical(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix) :], True
        name = name.replace("._fsdp_wrapped_module", "").replace("._checkpoint_wrapped_module", "")
    return name


def _inner_module(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP wrapper or a DeepSpeed engine (FSDP2 keeps the module itself)."""
    inner = model
    while type(inner).__name__ in _WRAPPERS and isinstance(
        child := getattr(inner, "module", None), nn.Module
    ):
        inner = child
    return inner


_WRAPPERS = {"DistributedDataParallel", "DataParallel", "DeepSpeedEngine", "PipelineEngine"}


def _is_zero3(param: torch.Tensor) -> bool:
    return hasattr(param, "ds_id")


def _full(param: torch.Tensor) -> torch.Tensor:
    """The full value of one parameter on every rank (collective for DTensor / ZeRO-3 params)."""
    data = param.detach()
    if hasattr(data, "full_tensor"):  # FSDP2 / DTensor
        full: torch.Tensor = data.full_tensor()
        return full
    if _is_zero3(param):
        import deepspeed  # lazy: an optional extra, and only DeepSpeed models get here

        with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
            return param.detach().clone()
    return data


def params_sha256(model: nn.Module) -> str:
    """sha256 over (name, dtype, shape, bytes) of every parameter, names sorted, wrappers stripped.

    Identical for DDP, FSDP2 and DeepSpeed given the same values. A collective: call on every rank.
    """
    module = _inner_module(model)
    params = sorted(((_canonical(n), p) for n, p in module.named_parameters()), key=lambda x: x[0])
    return digest((name, _full(param)) for name, param in params)


def digest(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over (name, dtype, shape, bytes) of full parameter values, in the order given."""
    out = hashlib.sha256()
    for name, value in named:
        full = value.cpu().contiguous()
        out.update(
            f"{name}|{str(full.dtype).removeprefix('torch.')}|{tuple(full.shape)}\n".encode()
        )
        out.update(full.reshape(-1).view(torch.uint8).numpy().tobytes())
    return out.hexdigest()


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
