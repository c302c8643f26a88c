from __future__ import annotations

import copy
import dataclasses
import math
import pickle
from dataclasses import dataclass, field
from functools import cached_property

import pytest

from hpctrain.kernel.values import frozen, mutable


def make(deco):
    @deco
    class P:
        """doc"""

        a: int
        b: str = "x"
        c: list[int] = field(default_factory=list)
        d: float = field(default=1.0, compare=False)
        e: int = field(default=3, repr=False)

        @cached_property
        def twice(self) -> int:
            return self.a * 2

    return P


def make_kw(deco):
    @deco
    class K:
        x: int
        y: int = 2
        z: tuple[int, ...] = ()

        def __post_init__(self) -> None:
            if self.x < 0:
                raise ValueError("neg")

    return K


Std = make(dataclass(frozen=True))
Ours = make(frozen)
StdK = make_kw(dataclass(frozen=True, kw_only=True))
OursK = make_kw(frozen(kw_only=True))


def test_same():
    for S, Cls in ((Std, Ours),):
        s, o = S(1, "y", [1]), Cls(1, "y", [1])
        assert repr(s).replace("Std", "") == repr(o).replace("Ours", "")
        assert repr(o) == "make.<locals>.P(a=1, b='y', c=[1], d=1.0)"
        assert o == Cls(1, "y", [1], d=9.0) and o != Cls(2) and (o == 3) is False
        with pytest.raises(dataclasses.FrozenInstanceError):
            o.a = 3
        with pytest.raises(dataclasses.FrozenInstanceError):
            del o.a
        with pytest.raises(dataclasses.FrozenInstanceError):
            o.new = 3
        assert o.twice == 2 and o.twice == 2
        assert dataclasses.replace(o, a=5).a == 5 and dataclasses.replace(o, a=5).b == "y"
        assert dataclasses.asdict(o) == {"a": 1, "b": "y", "c": [1], "d": 1.0, "e": 3}
        assert [f.name for f in dataclasses.fields(o)] == ["a", "b", "c", "d", "e"]
        assert dataclasses.is_dataclass(o)
        assert Cls.__match_args__ == S.__match_args__
        assert copy.deepcopy(o) == o and copy.copy(o) == o
        assert Cls(1).c == [] and Cls(1).c is not Cls(1).c
        with pytest.raises(TypeError):
            Cls()
        with pytest.raises(TypeError):
            Cls(1, 2, [], 1.0, 3, 4)
        with pytest.raises(TypeError):
            Cls(1, a=2)
        with pytest.raises(TypeError):
            Cls(1, zz=2)
        with pytest.raises(TypeError):
            hash(o)  # a list field
        assert hash(Cls(1, "y", (1,))) == hash(Cls(1, "y", (1,), d=2.0))
    k = OursK(x=1, z=(1,))
    assert k == OursK(x=1, y=2, z=(1,)) and hash(k) == hash(OursK(x=1, z=(1,)))
    with pytest.raises(TypeError):
        OursK(1)
    with pytest.raises(ValueError):
        OursK(x=-1)
    with pytest.raises(ValueError):
        StdK(x=-1)
    assert repr(k) == repr(StdK(x=1, z=(1,))) == "make_kw.<locals>.K(x=1, y=2, z=(1,))"
    nan = OursK(x=1, z=(math.nan,))
    assert nan == nan and StdK(x=1, z=(math.nan,)) == StdK(x=1, z=(math.nan,))
    assert hash(nan) == hash(nan)


@frozen
class Top:
    a: int
    b: tuple[int, ...] = ()


def test_pickle():
    t = Top(1, (2,))
    assert pickle.loads(pickle.dumps(t)) == t and copy.deepcopy(t) == t
    assert repr(t) == "Top(a=1, b=(2,))"
    assert Top.__init__.__qualname__ == "Top.__init__"


@mutable
class M:
    a: int
    b: list[int] = field(default_factory=list)


@dataclass
class MS:
    a: int
    b: list[int] = field(default_factory=list)


def test_mutable():
    m = M(1)
    m.a = 2
    m.c = 3
    assert m.a == 2 and m.b == [] and m == M(2) and repr(M(1, [2])) == "M(a=1, b=[2])"
    assert repr(MS(1, [2])) == repr(M(1, [2])).replace("M(", "MS(")
    with pytest.raises(TypeError):
        hash(m)
    with pytest.raises(TypeError):
        hash(MS(1))
    assert dataclasses.replace(m, a=5).a == 5 and dataclasses.asdict(M(1)) == {"a": 1, "b": []}
    del m.c
    assert pickle.loads(pickle.dumps(M(1, [3]))) == M(1, [3])
    assert M.__hash__ is None and MS.__hash__ is None
