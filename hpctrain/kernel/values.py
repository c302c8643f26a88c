"""`@frozen` and `@mutable`: dataclasses without the dataclass module's start-up cost.

`@dataclass(frozen=True)` writes six methods as Python source and compiles each one: about 4 M
CPU instructions per class of six fields, at every start of every process that imports it
(`@dataclass`: three methods, 2 M). `submit --dry-run` imports some 30 of them, which cost more
than the command's own work (benchmarks/cli.py). Here the class is still a dataclass
(`dataclasses.fields`, `replace`, `asdict`, `is_dataclass` and type checkers see the same thing),
and its methods are shared functions that read the fields: the same behaviour (`__init__` with
defaults, default factories, keyword-only fields and `__post_init__`, but no InitVar; `__repr__`
and `__eq__` over the fields; frozen: `__hash__` over them and FrozenInstanceError on assignment;
mutable: unhashable), for 0.6 M a class. Each object costs a microsecond or two more to make: a
class made very often in a hot loop keeps `@dataclass`.
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Callable
from typing import TypeVar, dataclass_transform, overload

T = TypeVar("T", bound=type)


@overload
def frozen(cls: T, /) -> T: ...


@overload
def frozen(*, kw_only: bool = False) -> Callable[[T], T]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def frozen(cls: T | None = None, /, *, kw_only: bool = False) -> T | Callable[[T], T]:
    """`@frozen` or `@frozen(kw_only=True)`: as `@dataclass(frozen=True[, kw_only=True])`."""

    def wrap(cls: T) -> T:
        _build(cls, kw_only=kw_only, frozen=True)
        return cls

    return wrap if cls is None else wrap(cls)


@overload
def mutable(cls: T, /) -> T: ...


@overload
def mutable(*, kw_only: bool = False) -> Callable[[T], T]: ...


@dataclass_transform(field_specifiers=(dataclasses.field,))
def mutable(cls: T | None = None, /, *, kw_only: bool = False) -> T | Callable[[T], T]:
    """`@mutable` or `@mutable(kw_only=True)`: as `@dataclass[(kw_only=True)]`."""

    def wrap(cls: T) -> T:
        _build(cls, kw_only=kw_only, frozen=False)
        return cls

    return wrap if cls is None else wrap(cls)


def _build(cls: type, *, kw_only: bool, frozen: bool) -> None:
    for name in ("__setattr__", "__delattr__"):
        if frozen and name in cls.__dict__:
            raise TypeError(f"cannot overwrite attribute {name} in class {cls.__name__}")
    if cls.__doc__ is None:  # else dataclass() asks inspect for a signature to write one
        cls.__doc__ = cls.__name__
    dataclasses.dataclass(cls, init=False, repr=False, eq=False, kw_only=kw_only)  # the same class
    fields = dataclasses.fields(cls)
    # (name, default, factory) of each __init__ argument, in order; then of each field it sets
    # without an argument (field(init=False))
    init = [(f.name, f.default, f.default_factory) for f in fields if f.init]
    later = [(f.name, f.default, f.default_factory) for f in fields if not f.init]
    accepted = {name for name, _, _ in init}
    positional = [f.name for f in fields if f.init and not f.kw_only]
    names = {f.name for f in fields}
    shown = [f.name for f in fields if f.repr]
    compared = [f.name for f in fields if f.compare]
    hashed = [f.name for f in fields if (f.compare if f.hash is None else f.hash)]
    post_init = hasattr(cls, "__post_init__")
    missing = dataclasses.MISSING

    def __init__(self: object, *args: object, **kwargs: object) -> None:
        if args:
            if len(args) > len(positional):
                raise TypeError(
                    f"{cls.__name__}() takes {len(positional)} positional arguments but "
                    f"{len(args)} were given"
                )
            for name, value in zip(positional, args, strict=False):
                if name in kwargs:
                    raise TypeError(f"{cls.__name__}() got multiple values for argument {name!r}")
                kwargs[name] = value
        if not kwargs.keys() <= accepted:
            raise TypeError(
                f"{cls.__name__}() got an unexpected keyword argument "
                f"{min(kwargs.keys() - accepted)!r}"
            )
        values = self.__dict__  # as the generated __init__'s object.__setattr__
        for name, default, factory in init:
            if name in kwargs:
                values[name] = kwargs[name]
            elif default is not missing:
                values[name] = default
            elif factory is not missing:
                values[name] = factory()
            else:
                raise TypeError(f"{cls.__name__}() missing required argument: {name!r}")
        for name, default, factory in later:
            if default is not missing:
                values[name] = default
            elif factory is not missing:
                values[name] = factory()
        if post_init:
            self.__post_init__()  # type: ignore[attr-defined]  # checked above

    @reprlib.recursive_repr()
    def __repr__(self: object) -> str:
        inside = ", ".join(f"{name}={getattr(self, name)!r}" for name in shown)
        return f"{type(self).__qualname__}({inside})"

    def __eq__(self: object, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return _values(self, compared) == _values(other, compared)

    def __hash__(self: object) -> int:
        return hash(_values(self, hashed))

    def __setattr__(self: object, name: str, value: object) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        object.__setattr__(self, name, value)  # a subclass that is not frozen

    def __delattr__(self: object, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        object.__delattr__(self, name)

    own = cls.__dict__.get("__hash__", missing)
    explicit_hash = not (own is missing or (own is None and "__eq__" in cls.__dict__))
    methods: dict[str, Callable[..., object]] = {
        "__init__": __init__,
        "__repr__": __repr__,
        "__eq__": __eq__,
    }
    for name, fn in methods.items():
        if name not in cls.__dict__:  # else the class's own, as dataclass() leaves it
            _attach(cls, name, fn)
    if not frozen:
        if not explicit_hash:
            cls.__hash__ = None  # type: ignore[assignment]  # as @dataclass: eq without frozen
        return
    if not explicit_hash:
        _attach(cls, "__hash__", __hash__)
    _attach(cls, "__setattr__", __setattr__)
    _attach(cls, "__delattr__", __delattr__)


def _values(obj: object, names: list[str]) -> tuple[object, ...]:
    return tuple(getattr(obj, name) for name in names)


def _attach(cls: type, name: str, fn: Callable[..., object]) -> None:
    fn.__qualname__ = f"{cls.__qualname__}.{name}"
    setattr(cls, name, fn)
