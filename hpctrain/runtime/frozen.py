"""A snapshot's bytes (hpctrain/runtime/recovery.py): the state's tensors copied into one flat
CPU buffer behind a small skeleton of tagged JSON, made in one pass while the loop waits.

torch.save of the same state costs 6-7 ms per 5 MiB here (a zip archive, a copy per tensor, then
the archive copied out); one buffer allocated once and filled tensor by tensor costs what the
copies cost, and the buffer is what the store writes and the partner receives, no encoding after.

    [8 bytes: skeleton length, little endian][JSON {"tree", "slots"}][pad][tensor bytes...]

The skeleton is data, never code (no pickle: a snapshot lies in memory another process might
reach, docs/security.md): `tree` is the state with str, int, float, bool and None as JSON, and
every other value a one-key object: {"o": {str: node}} and {"d": [[key, value], ...]} (dicts,
order kept), {"l": [...]}, {"t": [...]} (list, tuple), {"b": base64} (bytes), {"s": i} (a tensor),
{"a": [i, dtype, shape]} (a numpy array, its bytes in slot i), {"n": [dtype, base64]} (a numpy
scalar). `slots[i]` is [offset, torch dtype name, shape]; offsets are 64-byte aligned, so a dtype
view of the buffer is always legal. Anything else in a state is refused when it is frozen.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import torch

ALIGN = 64
_HEAD = 8
_PLAIN = (int, float, str, bool, type(None))  # JSON as they are
_DTYPES = {
    str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)
}
_HINT = (
    "a snapshot holds plain tensors, numpy arrays and scalars, str, int, float, bool, None, bytes, "
    "and dicts, lists and tuples of them: keep other objects out of the state (or turn them into "
    "these, e.g. a DTensor's local tensor), or set snapshots off (snapshot_every=0)"
)


class Buffer:
    """Where `freeze` writes, kept from one snapshot to the next: its memory (fresh memory costs its
    page faults, 1.6 ms per 5 MiB here) and the tensor views of the layout last written into it
    (made again only when the layout changes: making a view costs more than copying a small
    tensor, and a state holds about a hundred)."""

    def __init__(self) -> None:
        self.flat: torch.Tensor | None = None
        self.layout: tuple[int, list[tuple[int, str, tuple[int, ...]]]] | None = None
        self.views: list[torch.Tensor] = []


class _Refused(TypeError):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what, self.path = what, list[str]()


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _skeleton(obj: object, tensors: list[torch.Tensor]) -> object:
    """`obj` as tagged JSON, its tensors (and arrays' bytes) appended to `tensors`."""

    def slot(t: torch.Tensor) -> int:
        tensors.append(t)
        return len(tensors) - 1

    def walk(o: object) -> object:  # (exact types: a subclass, e.g. a namedtuple, is refused)
        kind = type(o)
        if kind in _PLAIN:
            return o
        plain = kind in (torch.Tensor, torch.nn.Parameter)
        if plain and isinstance(o, torch.Tensor) and o.layout == torch.strided:
            return {"s": slot(o.detach())}
        try:
            if isinstance(o, dict):
                if all(type(k) is str for k in o):
                    return {"o": {k: walk(v) for k, v in o.items()}}
                return {"d": [[walk(k), walk(v)] for k, v in o.items()]}
            # python's RNG state: 625 ints, no call each
            if isinstance(o, list | tuple) and kind in (list, tuple):
                items = o if all(type(v) in _PLAIN for v in o) else [walk(v) for v in o]
                return {"l" if kind is list else "t": list(items)}
        except _Refused as e:  # where: the first item that fails alone (the error path only)
            seq = o if isinstance(o, list | tuple) else ()
            pairs = o.items() if isinstance(o, dict) else enumerate(seq)
            e.path.append(next((f"[{k!r}]" for k, v in pairs if refused(v)), "[?]"))
            raise
        if isinstance(o, bytes) and kind is bytes:
            return {"b": _b64(o)}
        if (
            isinstance(o, np.ndarray)
            and kind is np.ndarray
            and not o.dtype.hasobject
            and o.dtype.fields is None
        ):
            raw = np.ascontiguousarray(o).reshape(-1).view(np.uint8)
            raw = raw if raw.flags.writeable else raw.copy()  # torch warns on a read-only array
            return {"a": [slot(torch.from_numpy(raw)), o.dtype.str, list(o.shape)]}
        if isinstance(o, np.generic) and not o.dtype.hasobject and o.dtype.fields is None:
            return {"n": [o.dtype.str, _b64(o.tobytes())]}
        what = type(o).__name__
        if isinstance(o, torch.Tensor):
            what = f"{what} (layout {o.layout}): only a plain strided torch.Tensor"
        raise _Refused(what)

    def refused(o: object) -> bool:
        try:
            walk(o)
        except _Refused:
            return True
        return False

    try:
        return walk(obj)
    except _Refused as e:
        where = "state" + "".join(reversed(e.path))
        raise TypeError(f"cannot snapshot a {e.what} at {where}: {_HINT}") from None


def freeze(obj: object, into: Buffer | None = None) -> memoryview:
    """`obj` as bytes: every plain strided tensor (on any device) copied into one CPU buffer, the
    rest as tagged JSON (TypeError for a value it cannot hold, naming its type). `into`: the
    buffer to fill, grown when too small (the last snapshot's, once stored: the bytes returned
    before are overwritten)."""
    tensors: list[torch.Tensor] = []
    tree = _skeleton(obj, tensors)
    slots, off = [], 0
    for t in tensors:
        slots.append((off, str(t.dtype).removeprefix("torch."), tuple(t.shape)))
        off = _up(off + t.numel() * t.element_size())
    head = json.dumps({"tree": tree, "slots": slots}, separators=(",", ":")).encode()
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


def _shape(value: object) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(n) is int and n >= 0 for n in value):
        raise ValueError(f"snapshot skeleton: bad shape {value!r:.80}")
    return tuple(value)


def _np_dtype(name: object) -> np.dtype[np.generic]:
    if not isinstance(name, str):
        raise ValueError(f"snapshot skeleton: bad numpy dtype {name!r:.80}")
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise ValueError(f"snapshot skeleton: no numpy dtype {name!r:.80}") from None
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise ValueError(f"snapshot skeleton: numpy dtype {name!r:.80} holds objects or fields")
    return dtype


def thaw(data: bytes | bytearray | memoryview) -> object:
    """The state `freeze` made, every tensor and array its own CPU copy. Only data is read: a
    skeleton with a node it does not know, or out of bounds, raises ValueError."""
    buf = bytearray(data) if not isinstance(data, bytearray) else data
    n = int.from_bytes(bytes(buf[:_HEAD]), "little")
    if len(buf) < _HEAD or n > len(buf) - _HEAD:
        raise ValueError(f"snapshot: a skeleton of {n} bytes in {len(buf)}")
    try:
        head = json.loads(bytes(buf[_HEAD : _HEAD + n]).decode("utf-8"))
        tree, slots = head["tree"], head["slots"]
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"snapshot skeleton: not the JSON freeze writes ({e})") from None
    start = _up(_HEAD + n)
    flat = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)

    def region(i: object) -> tuple[int, torch.dtype, tuple[int, ...], int]:
        if type(i) is not int or not 0 <= i < len(slots) or not isinstance(slots[i], list):
            raise ValueError(f"snapshot skeleton: no slot {i!r:.40}")
        at, name, shape = (slots[i] + [None] * 3)[:3]
        dtype = _DTYPES.get(name) if isinstance(name, str) else None
        if type(at) is not int or at < 0 or dtype is None:
            raise ValueError(f"snapshot skeleton: bad slot {slots[i]!r:.80}")
        dims = _shape(shape)
        size = torch.Size(dims).numel() * dtype.itemsize
        if start + at + size > len(buf):
            raise ValueError(f"snapshot skeleton: slot {i} past the data's end")
        return start + at, dtype, dims, size

    def fill(o: object) -> object:  # tagged JSON in, a state's containers and leaves out
        if type(o) in _PLAIN:
            return o
        if not isinstance(o, dict) or len(o) != 1:  # (JSON: a dict is a plain dict)
            raise ValueError(f"snapshot skeleton: unknown node {o!r:.80}")
        ((tag, v),) = o.items()
        if tag == "o" and isinstance(v, dict):
            return {k: fill(x) for k, x in v.items()}
        if tag == "d" and isinstance(v, list) and all(type(p) is list and len(p) == 2 for p in v):
            try:
                return {fill(k): fill(x) for k, x in v}
            except TypeError as e:  # a key that cannot be one (a list, a dict)
                raise ValueError(f"snapshot skeleton: {e}") from None
        if tag in ("l", "t") and isinstance(v, list):
            items = [fill(x) for x in v]
            return items if tag == "l" else tuple(items)
        if tag == "b" and isinstance(v, str):
            return base64.b64decode(v, validate=True)
        if tag == "s":
            at, dtype, dims, size = region(v)
            return flat[at : at + size].view(dtype).view(dims).clone()
        if tag == "a" and isinstance(v, list) and len(v) == 3:
            at, _, _, size = region(v[0])
            kind, dims = _np_dtype(v[1]), _shape(v[2])
            if int(np.prod(dims)) * kind.itemsize != size:
                raise ValueError(f"snapshot skeleton: array {v!r:.80} does not fit its slot")
            return np.frombuffer(buf, np.uint8, size, at).view(kind).reshape(dims).copy()
        if tag == "n" and isinstance(v, list) and len(v) == 2 and isinstance(v[1], str):
            kind, raw = _np_dtype(v[0]), base64.b64decode(v[1], validate=True)
            if len(raw) != kind.itemsize:
                raise ValueError(f"snapshot skeleton: numpy scalar {v!r:.80} of the wrong size")
            return np.frombuffer(raw, kind, 1)[0]
        raise ValueError(f"snapshot skeleton: unknown node {o!r:.80}")

    try:
        return fill(tree)
    except RecursionError:
        raise ValueError("snapshot skeleton: nested too deep") from None
