"""A snapshot's bytes (hpctrain/runtime/recovery.py): the state's tensors copied into one flat
CPU buffer behind a small pickled skeleton, made in one pass while the loop waits.

torch.save of the same state costs 6-7 ms per 5 MiB here (a zip archive, a copy per tensor, then
the archive copied out); one buffer allocated once and filled tensor by tensor costs what the
copies cost, and the buffer is what the store writes and the partner receives, no encoding after.

    [8 bytes: skeleton length, little endian][pickled (skeleton, slots)][pad][tensor bytes...]

The skeleton is the state with each tensor replaced by `Slot(i)`; `slots[i]` is (offset, dtype
name, shape). Offsets are 64-byte aligned, so a dtype view of the buffer is always legal.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import torch

ALIGN = 64
_HEAD = 8
_ATOMS = (int, float, str, bool, bytes, type(None))


@dataclass(frozen=True)
class Slot:
    index: int


class Buffer:
    """Where `freeze` writes, kept from one snapshot to the next: its memory (fresh memory costs its
    page faults, 1.6 ms per 5 MiB here) and the tensor views of the layout last written into it
    (made again only when the layout changes: making a view costs more than copying a small
    tensor, and a state holds about a hundred)."""

    def __init__(self) -> None:
        self.flat: torch.Tensor | None = None
        self.layout: tuple[int, list[tuple[int, str, tuple[int, ...]]]] | None = None
        self.views: list[torch.Tensor] = []


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def freeze(obj: Any, into: Buffer | None = None) -> memoryview:  # Any: a state's leaves
    """`obj` as bytes: every plain strided tensor (on any device) copied into one CPU buffer, the
    rest pickled. Other leaves are pickled as they are now: state changed in place must be tensors,
    arrays, or dicts/lists/tuples of them. `into`: the buffer to fill, grown when too small (the
    last snapshot's, once stored: the bytes returned before are overwritten)."""
    tensors: list[torch.Tensor] = []

    def walk(o: Any) -> Any:  # Any: a state's containers and leaves
        if type(o) in (torch.Tensor, torch.nn.Parameter) and o.layout == torch.strided:
            tensors.append(o.detach())
            return Slot(len(tensors) - 1)
        if isinstance(o, torch.Tensor):  # a subclass (DTensor, ...) or a sparse one: pickled
            return o.detach().clone()
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if type(o) in (list, tuple):
            if all(type(v) in _ATOMS for v in o):  # python's RNG state: 625 ints
                return o
            return type(o)(walk(v) for v in o)
        return o

    skeleton = walk(obj)
    slots, off = [], 0
    for t in tensors:
        slots.append((off, str(t.dtype).removeprefix("torch."), tuple(t.shape)))
        off = _up(off + t.numel() * t.element_size())
    head = pickle.dumps((skeleton, slots), protocol=pickle.HIGHEST_PROTOCOL)
    start = _up(_HEAD + len(head))
    total = start + off
    into = into or Buffer()
    if into.flat is None or into.flat.numel() < total:
        into.flat, into.layout = torch.empty(total, dtype=torch.uint8), None
    flat = into.flat[:total]
    if into.layout != (start, slots):
        into.layout, into.views = (
            (start, slots),
            [
                flat[start + at : start + at + t.numel() * t.element_size()]
                .view(t.dtype)
                .view(shape)
                for t, (at, _, shape) in zip(tensors, slots, strict=True)
            ],
        )
    flat[:_HEAD].copy_(torch.tensor(list(len(head).to_bytes(_HEAD, "little")), dtype=torch.uint8))
    flat[_HEAD : _HEAD + len(head)].copy_(torch.frombuffer(bytearray(head), dtype=torch.uint8))
    for view, t in zip(into.views, tensors, strict=True):
        view.copy_(t)
    return flat.numpy().data  # uint8, one dimension: format "B"


def thaw(data: bytes | bytearray | memoryview) -> Any:  # Any: the state frozen
    """The state `freeze` made, every tensor its own CPU copy."""
    buf = bytearray(data) if not isinstance(data, bytearray) else data
    n = int.from_bytes(bytes(buf[:_HEAD]), "little")
    skeleton, slots = pickle.loads(bytes(buf[_HEAD : _HEAD + n]))  # noqa: S301 (own node's memory)
    start = _up(_HEAD + n)
    flat = torch.frombuffer(buf, dtype=torch.uint8)
    made = []
    for at, dtype_name, shape in slots:
        dtype = getattr(torch, dtype_name)
        size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        made.append(flat[start + at : start + at + size].view(dtype).view(shape).clone())

    def fill(o: Any) -> Any:  # Any: a state's containers and leaves
        if isinstance(o, Slot):
            return made[o.index]
        if isinstance(o, dict):
            return {k: fill(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)) and type(o) in (list, tuple):
            return type(o)(fill(v) for v in o)
        return o

    return fill(skeleton)
