"""Reusable staging buffers for async saves (see Stager)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import cast

import torch

from train_entry.checkpoint.statedict import StateDict
from train_entry.compat import copy_state_dict, cpu_state_dict, local_tensor


def _layout(obj: object) -> object:
    """The structure of a state dict: keys, and each tensor's type, dtype, shape and device."""
    if isinstance(obj, dict):
        return tuple((k, _layout(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return (type(obj), tuple(_layout(v) for v in obj))
    if isinstance(obj, torch.Tensor):
        local = local_tensor(obj)  # a DTensor's shard
        return (type(obj), obj.dtype, tuple(obj.shape), tuple(local.shape), str(obj.device))
    return type(obj)


def _select(obj: object, keep: Callable[[torch.Tensor], bool]) -> object:
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
        self.layout: object = None  # the cached state dict's (_layout)
        self.cache: StateDict = {}  # the CPU buffers
        self._stream: torch.cuda.Stream | None = None
        self._ready: torch.cuda.Event | None = None
        self._cuda = False
        self._sd: StateDict | None = None
        # for the last sd: (now src, now dst), (later src, later dst)
        self._pairs: tuple[tuple[StateDict, StateDict], ...] = ()

    def begin(self, sd: StateDict, movable: Callable[[], set[int]], same: bool = False) -> None:
        """`same`: `sd` is the last save's state dict, holding the same tensors (StateDicts)."""
        if not (same and sd is self._sd and self._pairs):
            layout = _layout(sd)
            self._cuda = any(str(d).startswith("cuda") for d in _devices(sd))
            if layout != self.layout:
                self.layout, self.cache = layout, cpu_state_dict(sd, pin_memory=self._cuda)
            moves = movable()
            now = _select(sd, lambda t: local_tensor(t).data_ptr() not in moves)
            later = _select(sd, lambda t: local_tensor(t).data_ptr() in moves)
            self._pairs = tuple(
                (_tensors(part), _tensors(_select_like(self.cache, part))) for part in (now, later)
            )
            self._sd = sd
        if self._cuda:
            # torch.cuda.Stream/Event take untyped constructor arguments (their __new__)
            self._stream = self._stream or torch.cuda.Stream()  # type: ignore[no-untyped-call]
            self._ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._ready.record()  # the step's kernels before the copy
        copy_state_dict(*self._pairs[0])

    def finish(self) -> StateDict:
        src, dst = self._pairs[1]
        if self._stream is not None and self._ready is not None:  # set together by begin()
            self._stream.wait_event(self._ready)
            with torch.cuda.stream(self._stream):
                copy_state_dict(src, dst, non_blocking=True)
            self._stream.synchronize()
        else:
            copy_state_dict(src, dst)
        # the full structure: staged tensors, the scalars as they were at begin()
        return cast(StateDict, _merge_staged(self._sd, self.cache))  # sd's structure: a dict


def _devices(obj: object) -> set[str]:
    if isinstance(obj, dict):
        return set().union(*(_devices(v) for v in obj.values())) if obj else set()
    if isinstance(obj, (list, tuple)):
        return set().union(*(_devices(v) for v in obj)) if obj else set()
    if isinstance(obj, torch.Tensor):
        return {str(local_tensor(obj).device)}
    return set()


def _select_like(cache: object, pattern: object) -> object:
    """The cache's tensors at the places `pattern` holds one (the same structure as `cache`)."""
    if isinstance(pattern, dict):
        mapping = cast(Mapping[str, object], cache)
        return {k: _select_like(mapping[k], v) for k, v in pattern.items()}
    if isinstance(pattern, list):
        items = cast(Sequence[object], cache)
        return [_select_like(c, v) for c, v in zip(items, pattern, strict=True)]
    return cache if pattern is not None else None


def _tensors(obj: object) -> StateDict:
    """A state dict of `_select`'s result, its None leaves (and empty containers) dropped, so
    copy_state_dict sees tensors only."""
    pruned = _prune_none(obj)
    return pruned if isinstance(pruned, dict) else {}


def _prune_none(obj: object) -> object:
    """Drop the None leaves (and empty containers)."""
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


def _merge_staged(sd: object, cache: object) -> object:
    """`sd`'s structure and plain leaves with the staged tensors of `cache` (the same structure)."""
    if isinstance(sd, dict):
        mapping = cast(Mapping[str, object], cache)
        return {k: _merge_staged(v, mapping[k]) for k, v in sd.items()}
    if isinstance(sd, (list, tuple)):
        items = cast(Sequence[object], cache)
        return type(sd)(_merge_staged(v, c) for v, c in zip(sd, items, strict=True))
    if isinstance(sd, torch.Tensor):
        return cache
    return sd
