"""The DCP side of a save: the holder DCP saves and loads (AppState), and the caches that make a
save after the first cheap: the state dict (StateDicts) and the save plan (PlanCache)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

import torch
from torch import nn
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan
from torch.distributed.checkpoint.state_dict import (
    DictValueType,
    OptimizerStateType,
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from train_entry.compat import DefaultSavePlanner, local_tensor

# Where a leaf lies in a nested state dict: the keys and list indices down to it (DCP's OBJ_PATH).
ObjPath = tuple[str | int, ...]
# What DCP saves under "app": {"model": ..., "optim": ...} (nested containers of tensors and plain
# leaves; see AppState)
StateDict = dict[str, object]


class AppState:
    """DCP Stateful holder: model + optimizer through get/set_state_dict (FQNs without wrappers).

    `flat`: the optimizer state flattened per parameter name (param groups too), which is what a
    pipeline-parallel run needs: each pp rank holds other parameters, so one shared `param_groups`
    list (saved once, by the lowest rank) would not describe them. Runs on a device mesh save flat;
    a load reads whichever form the checkpoint has (`is_flat`)."""

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer | None, flat: bool = False
    ) -> None:
        self.model, self.optimizer, self.flat = model, optimizer, flat

    def _options(self) -> StateDictOptions | None:
        return StateDictOptions(flatten_optimizer_state_dict=True) if self.flat else None

    def parts(self) -> tuple[DictValueType, OptimizerStateType | None]:
        """The model's state dict and the optimizer's (None without an optimizer)."""
        if self.optimizer is None:
            return get_model_state_dict(self.model), None
        return get_state_dict(self.model, self.optimizer, options=self._options())

    def state_dict(self) -> StateDict:
        model_sd, optim_sd = self.parts()
        return {"model": model_sd} if optim_sd is None else {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, sd: Mapping[str, object]) -> None:
        model_sd = cast(DictValueType, sd["model"])  # what state_dict() saved, loaded in place
        if self.optimizer is None:
            set_model_state_dict(self.model, model_sd)
        else:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=model_sd,
                optim_state_dict=cast(OptimizerStateType, sd["optim"]),
                options=self._options(),
            )


def is_flat(metadata: Metadata) -> bool:
    """The checkpoint's optimizer state is flattened per parameter (AppState(flat=True)): its
    param groups are keyed by parameter name (`param_groups.<fqn>.lr`), not by group index."""
    keys = metadata.state_dict_metadata
    names = (k.removeprefix("app.model.") for k in keys if k.startswith("app.model."))
    return any(f"app.optim.param_groups.{name}.lr" in keys for name in names)


class StateDicts:
    """The state dict of the last save, reused while it still holds the live tensors.

    get_state_dict walks every parameter's FQN (milliseconds). Its tensors are the parameters,
    buffers and optimizer state themselves (or views of them), which training updates in place;
    so while every one of them keeps its storage, shape and dtype (the fingerprint), the previous
    result is still the state, once its non-tensor leaves (the param groups' lr, ...) are taken
    afresh. Anything else (a new tensor, a scalar in the optimizer state, a module with extra
    state or a post-state-dict hook) builds it again."""

    def __init__(self) -> None:
        self._key: list[object] | None = None
        self._sd: StateDict | None = None
        self._groups: Sequence[dict[str, object]] = ()  # the cached optimizer's param groups
        self.reused = False  # the last get() returned the previous state dict (same tensors)

    def get(
        self, model: nn.Module, optimizer: torch.optim.Optimizer | None, flat: bool = False
    ) -> StateDict:
        if flat:  # flattened param groups are keyed by name: built afresh each save (no cache)
            self.reused, self._key, self._sd = False, None, None
            return AppState(model, optimizer, flat=True).state_dict()
        key = _fingerprint(model, optimizer)
        self.reused = self._sd is not None and key == self._key
        if self.reused:
            assert self._sd is not None
            if optimizer is not None:
                for cached, live in zip(self._groups, optimizer.param_groups, strict=True):
                    cached.update((k, v) for k, v in live.items() if k != "params")
            return self._sd
        sd = AppState(model, optimizer).state_dict()
        self._key, self._sd = (key, sd) if _cacheable(model) else (None, None)
        optim = sd.get("optim")  # DCP's optimizer state dict: its param groups are a list of dicts
        groups = optim.get("param_groups") if isinstance(optim, dict) else None
        self._groups = cast(list[dict[str, object]], groups or [])
        return sd


def _fingerprint(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> list[object]:
    out: list[object] = [id(model), id(optimizer)]
    out.extend(
        (local_tensor(t).data_ptr(), t.shape, t.dtype)
        for t in (*model.parameters(), *model.buffers())
    )
    if optimizer is not None:
        for group in optimizer.param_groups:
            out.append(tuple(map(id, group["params"])))
            out.append(tuple((k, type(v)) for k, v in group.items()))
        for param, st in optimizer.state.items():
            out.append(id(param))
            out.extend(
                (k, local_tensor(v).data_ptr(), v.shape, v.dtype)
                if isinstance(v, torch.Tensor)
                else (k, v)
                for k, v in st.items()
            )
    return out


def _cacheable(model: nn.Module) -> bool:
    return not any(
        type(m).get_extra_state is not nn.Module.get_extra_state or m._state_dict_hooks
        for m in model.modules()
    )


class PlanCache:
    """DCP's plan caching, without DCP's collectives: the first save (and any save whose local
    plan changed on some rank) goes through dcp.save; after it, each rank keeps its local plan (the
    key), its final plan (what it writes) and the global metadata. A later save whose local plan
    is the same on every rank (agreed in the all-reduce the save makes anyway) writes its final
    plan straight away, and rank 0 writes the metadata with the offsets every rank reports."""

    _leaves: list[tuple[str, ObjPath]]  # the cached planner's non-tensor leaves
    _candidate: tuple[SavePlan, DefaultSavePlanner, StateDict]  # the last plan made

    def __init__(self) -> None:
        self.local: SavePlan | None = None
        self.final: SavePlan | None = None
        self.metadata: Metadata | None = None
        # set up on `_sd` (the StateDicts result the plan was made of)
        self._planner: DefaultSavePlanner | None = None
        self._sd: StateDict | None = None

    def planner(
        self, sd: StateDict, rank: int, same: bool | None = None
    ) -> tuple[DefaultSavePlanner, bool]:
        """A planner set up on `sd` and whether this rank's plan differs from the cached one.
        `same`: `sd` is the StateDicts result, True when its tensors are unchanged (reused); then
        a planner set up on it before is reused, its non-tensor leaves taken afresh. None (an
        async save's staged copy, new each time): the planner is not kept."""
        if same and self.final is not None and self._planner is not None and sd is self._sd:
            p = self._planner
            for fqn, path in self._leaves:
                p.state_dict[fqn] = _at({"app": sd}, path)
            return p, False
        p = DefaultSavePlanner()
        p.set_up_planner({"app": sd}, is_coordinator=rank == 0)
        local = p.create_local_plan()
        changed = (
            self.final is None
            or self.local is None  # set together with `final`
            or local.items != self.local.items
            or local.planner_data != self.local.planner_data
        )
        self._candidate = (local, p, sd)
        if not changed and same is not None:
            self._planner, self._sd = p, sd
            self._leaves = _leaves(p)
        return p, changed

    def keep(self, final: SavePlan, metadata: Metadata) -> None:
        """After a full dcp.save succeeded on every rank."""
        self.local, self._planner, self._sd = self._candidate
        self._leaves = _leaves(self._planner)
        self.final, self.metadata = final, metadata

    def clear(self) -> None:
        self.local = self.final = self.metadata = self._planner = self._sd = None


def _leaves(p: DefaultSavePlanner) -> list[tuple[str, ObjPath]]:
    """The planner's non-tensor leaves (fqn, path in the state dict): what changes in place."""
    return [(k, p.mappings[k]) for k, v in p.state_dict.items() if not isinstance(v, torch.Tensor)]


def _at(obj: object, path: ObjPath) -> object:
    """The leaf at `path` of nested dicts (str keys) and lists (int indices)."""
    for key in path:
        if isinstance(key, str):
            obj = cast(Mapping[str, object], obj)[key]
        else:
            obj = cast(Sequence[object], obj)[key]
    return obj


def planner() -> DefaultSavePlanner:
    """DCP's default planner for a full save (PlanCache decides when one is needed)."""
    return DefaultSavePlanner()
