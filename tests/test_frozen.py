"""A snapshot's bytes (hpctrain/runtime/frozen.py): what goes in comes out, bit for bit, typed as
it went in, from a fresh buffer or a reused one, and later changes to the live state do not leak
into a snapshot already taken."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from hpctrain.runtime.frozen import Buffer, freeze, thaw


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(
                a.view(torch.uint8) if a.dtype == torch.bool else a,
                b.view(torch.uint8) if b.dtype == torch.bool else b,
            )
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and bool((a == b).all())
    return a == b


def _state() -> dict[str, object]:
    g = torch.Generator().manual_seed(3)
    return {
        "model": {
            "w": torch.randn(7, 5, generator=g),
            "half": torch.randn(3, generator=g).to(torch.bfloat16),
            "t": torch.randn(4, 6, generator=g).t(),  # not contiguous
            "mask": torch.tensor([True, False, True]),
            "scalar": torch.tensor(2.5, dtype=torch.float64),
            "empty": torch.zeros(0, 3),
            "ids": torch.arange(5, dtype=torch.int64),
        },
        "optim": {
            "param_groups": [{"lr": 1e-3, "params": [0, 1]}],
            "state": {0: {"step": torch.tensor(4.0)}},
        },
        "rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        },
        "loop": (3, "epoch", None),
        "step": 12,
    }


def test_round_trip_is_exact_and_keeps_types():
    state = _state()
    back = thaw(freeze(state))
    assert _same(state, back)
    assert not back["model"]["t"].is_contiguous() or back["model"]["t"].shape == (6, 4)


def test_a_taken_snapshot_does_not_follow_the_live_state():
    state = _state()
    data = bytes(freeze(state))
    state["model"]["w"].add_(1.0)  # training goes on after the loop's copy
    assert not torch.equal(thaw(data)["model"]["w"], state["model"]["w"])
    assert torch.equal(thaw(data)["model"]["w"] + 1.0, state["model"]["w"])


@pytest.mark.parametrize("grow", [False, True])
def test_a_reused_buffer_gives_the_same_bytes_as_a_fresh_one(grow):
    state = _state()
    buf = Buffer()
    first = bytes(freeze(state, buf))
    where = buf.flat.data_ptr()
    if grow:  # a larger state than the buffer holds: a fresh buffer
        state["model"]["extra"] = torch.ones(1000)
    else:  # the same layout, new values: the views made for the first are reused
        state["model"]["w"].add_(1.0)
    views = list(buf.views)
    again = freeze(state, buf)
    assert _same(state, thaw(again)) and _same(thaw(again), thaw(freeze(state)))
    assert not _same(thaw(first), thaw(again))
    # the same memory and views, kept only when the layout fits
    assert (buf.flat.data_ptr() == where) != grow
    assert all(map(torch.Tensor.is_set_to, views, buf.views)) != grow


def test_a_parameter_comes_back_as_its_values():
    p = torch.nn.Parameter(torch.randn(3, 3))
    back = thaw(freeze({"p": p}))
    assert torch.equal(back["p"], p.detach()) and not back["p"].requires_grad


def test_plain_values_arrays_and_keys_come_back_as_they_went_in():
    """The skeleton is tagged JSON (no pickle): dict keys of any plain type and their order,
    tuples apart from lists, floats bit for bit (nan, inf, -0.0), bytes, numpy arrays of every
    plain dtype (0-d and non-contiguous too) and numpy scalars keep their types."""
    odd = np.arange(12, dtype=np.uint32).reshape(3, 4)[:, ::2]
    state = {
        3: "int key",
        (1, "a"): [None, True, 2**70, -0.0, float("inf")],
        "z": {"b": b"\x00\xff", "t": ()},
        "arrays": [odd, np.array(2.5), np.zeros((0, 2), dtype=np.float16), np.array([True])],
        "scalars": (np.float32(1.5), np.int64(-3), np.bool_(True), np.datetime64("2026-01-01")),
    }
    back = thaw(freeze(state))
    assert list(back) == [3, (1, "a"), "z", "arrays", "scalars"] and _same(state, back)
    assert str(back[(1, "a")][3]) == "-0.0" and back["arrays"][0].dtype == np.uint32
    assert [type(v) for v in back["scalars"]] == [type(v) for v in state["scalars"]]
    nan = thaw(freeze({"x": float("nan")}))["x"]
    assert nan != nan


@pytest.mark.parametrize(
    "value", [{1, 2}, torch.Size([2]), torch.randn(2).to_sparse(), object(), bytearray(b"x")]
)
def test_a_value_a_snapshot_cannot_hold_is_refused_by_name(value):
    with pytest.raises(
        TypeError, match=rf"cannot snapshot a {type(value).__name__}.* at state\['k'\]"
    ):
        freeze({"k": value})
