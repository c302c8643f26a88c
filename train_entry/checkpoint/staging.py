"""Reusable staging buffers for async saves (see Stager)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from train_entry.compat import copy_state_dict, cpu_state_dict, local_tensor


def _layout(obj: Any) -> Any:  # Any: torch objects (tensors, modules, optimizers, state dicts)
    """The structure of a state dict: keys, and each tensor's type, dtype, shape and device."""
    if isinstance(obj, dict):
        return tuple((k, _layout(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return (type(obj), tuple(_layout(v) for v in obj))
    if isinstance(obj, torch.Tensor):
        local = local_tensor(obj)  # a DTensor's shard
        return (type(obj), obj.dtype, tuple(obj.shape), tuple(local.shape), str(obj.device))
    return type(obj)


# Any: torch objects (tensors, modules, optimizers, state dicts)
def _select(obj: Any, keep: Any) -> Any:
    """The same nested structure holding only the tensors `keep(tensor)` accepts (others None)."""
    if isinstance(obj, dict):
        return {k: _select(v, keep) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_select(v, keep) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj if keep(obj) else None
    return None


class Stager:
    """Copies a state dict into CPU buffers allocated at the first save and reused while its
    layout stays the same (pinned when the state is on a GPU, copied on a side stream).

    `begin(sd, movable)` copies now the tensors `movable()` does not name (model buffers, which a
    forward pass may change in place) and returns; `finish()` (on the writer thread) copies the
    rest: parameters and optimizer state, which only the optimizer's step changes, so the copy
    overlaps the next step's forward and backward and the step waits for it (`Checkpointer`
    installs an optimizer pre-step hook). Safe because one save finishes before the next starts."""

    def __init__(self) -> None:
        self.layout: Any = None  # Any: torch objects (tensors, modules, optimizers, state dicts)
        self.cache: Any = None  # Any: torch objects (tensors, modules, optimizers, state dicts)
        self._stream: torch.cuda.Stream | None = None
        self._ready: torch.cuda.Event | None = None
        self._sd: Any = None  # Any: torch objects (tensors, modules, optimizers, state dicts)
        # Any: torch objects (tensors, modules, optimizers, state dicts)
        self._pairs: Any = None  # for the last sd: (now src, now dst), (later src, later dst)

    def begin(
        self, sd: dict[str, Any], movable: Callable[[], set[int]], same: bool = False
    ) -> None:
        """`same`: `sd` is the last save's state dict, holding the same tensors (StateDicts)."""
        if not (same and sd is self._sd and self._pairs is not None):
            layout = _layout(sd)
            self._cuda = any(str(d).startswith("cuda") for d in _devices(sd))
            if layout != self.layout:
                self.layout, self.cache = layout, cpu_state_dict(sd, pin_memory=self._cuda)
            moves = movable()
            now = _select(sd, lambda t: local_tensor(t).data_ptr() not in moves)
            later = _select(sd, lambda t: local_tensor(t).data_ptr() in moves)
            self._pairs = tuple(
                (_prune_none(part), _prune_none(_select_like(self.cache, part)))
                for part in (now, later)
            )
            self._sd = sd
        if self._cuda:
            # torch.cuda.Stream/Event take untyped constructor arguments (their __new__)
            self._stream = self._stream or torch.cuda.Stream()  # type: ignore[no-untyped-call]
            self._ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._ready.record()  # the step's kernels before the copy
        copy_state_dict(*self._pairs[0])

    def finish(self) -> dict[str, Any]:
        src, dst = self._pairs[1]
        if self._stream is not None and self._ready is not None:  # set together by begin()
            self._stream.wait_event(self._ready)
            with torch.cuda.stream(self._stream):
                copy_state_dict(src, dst, non_blocking=True)
            self._stream.synchronize()
        else:
            copy_state_dict(src, dst)
        # the full structure: staged tensors, the scalars as they were at begin()
        merged: dict[str, Any] = _merge_staged(self._sd, self.cache)
        return merged


# Any: torch objects (tensors, modules, optimizers, state dicts)
def _devices(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        return set().union(*(_devices(v) for v in obj.values())) if obj else set()
    if isinstance(obj, (list, tuple)):
        return set().union(*(_devices(v) for v in obj)) if obj else set()
    if isinstance(obj, torch.Tensor):
        return {str(local_tensor(obj).device)}
    return set()


# Any: torch objects (tensors, modules, optimizers, state dicts)
def _select_like(cache: Any, pattern: Any) -> Any:
    """The cache's tensors at the places `pattern` holds one."""
    if isinstance(pattern, dict):
        return {k: _select_like(cache[k], v) for k, v in pattern.items()}
    if isinstance(pattern, list):
        return [_select_like(c, v) for c, v in zip(cache, pattern, strict=True)]
    return cache if pattern is not None else None


def _prune_none(obj: Any) -> Any:  # Any: torch objects (tensors, modules, optimizers, state dicts)
    """Drop the None leaves (and empty containers) so _copy_state_dict sees tensors only."""
    if isinstance(obj, dict):
        out = {k: _prune_none(v) for k, v in obj.items()}
        return {
            k: v
            for k, v in out.items()
            if v is not None and not (isinstance(v, (dict, list)) and not v)
        }
    if isinstance(obj, list):
        return [_prune_none(v) for v in obj]
    return obj


# Any: torch objects (tensors, modules, optimizers, state dicts)
def _merge_staged(sd: Any, cache: Any) -> Any:
    if isinstance(sd, dict):
        return {k: _merge_staged(v, cache[k]) for k, v in sd.items()}
    if isinstance(sd, (list, tuple)):
        return type(sd)(_merge_staged(v, c) for v, c in zip(sd, cache, strict=True))
    if isinstance(sd, torch.Tensor):
        return cache
    return sd
