"""What the checkpointer's parts share: the failure every rank agrees on, the DCP holder, the
state dict and save plan caches."""

from __future__ import annotations

import errno
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

LOW_SPACE = 64 << 20  # a save that failed with less free than this failed for lack of space


class SaveFailed(Exception):
    """A checkpoint could not be written (full disk, I/O error). Raised on EVERY rank at once (the
    ranks agree on it at each step of the save), so the caller can go on training together."""

    def __init__(self, step: int, folder: Path, cause: BaseException | None) -> None:
        self.step, self.folder, self.cause = step, folder, cause
        self.no_space = getattr(cause, "errno", None) == errno.ENOSPC or "No space left" in str(
            cause
        )
        if not self.no_space:  # torch's zip writer hides ENOSPC ("unexpected pos"): ask the disk
            try:
                self.no_space = (
                    shutil.disk_usage(folder if folder.exists() else folder.parent).free < LOW_SPACE
                )
            except OSError:
                pass
        lines = (
            (getattr(cause, "strerror", None) or str(cause) or type(cause).__name__)
            .strip()
            .splitlines()
        )
        reason = (
            "no space left on the device"
            if self.no_space
            else (lines[-1][:200] if cause is not None else "another rank failed")
        )
        super().__init__(f"checkpoint of step {step} into {folder} failed: {reason}")


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BaseException | None:
    """Run one step of a save on this rank: None, or the I/O error it raised (for _agree)."""
    try:
        fn(*args, **kwargs)
    except OSError as exc:
        return exc
    except BaseException as exc:
        # DCP wraps each rank's failure in a CheckpointException (a BaseException, on every rank)
        if type(exc).__name__ == "CheckpointException" or (
            isinstance(exc, Exception) and "No space left" in str(exc)
        ):
            return exc
        raise
    return None


def stderr(msg: str) -> None:
    print(f"[hpctrain checkpoint] {msg}", file=sys.stderr, flush=True)


class AppState:
    """DCP Stateful holder: model + optimizer through get/set_state_dict (FQNs without wrappers)."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, sd: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self.optimizer is None:
            set_model_state_dict(self.model, sd["model"])
        else:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=sd["model"],
                optim_state_dict=sd["optim"],
            )


class StateDicts:
    """The state dict of the last save, reused while it still holds the live tensors.

    get_state_dict walks every parameter's FQN (milliseconds). Its tensors are the parameters,
    buffers and optimizer state themselves (or views of them), which training updates in place;
    so while every one of them keeps its storage, shape and dtype (the fingerprint), the previous
    result is still the state, once its non-tensor leaves (the param groups' lr, ...) are taken
    afresh. Anything else (a new tensor, a scalar in the optimizer state, a module with extra
    state or a post-state-dict hook) builds it again."""

    def __init__(self) -> None:
        self._key: Any = None
        self._sd: dict | None = None
        self.reused = False  # the last get() returned the previous state dict (same tensors)

    def get(self, model: Any, optimizer: Any) -> dict:
        key = _fingerprint(model, optimizer)
        self.reused = self._sd is not None and key == self._key
        if self.reused:
            assert self._sd is not None
            if optimizer is not None:
                for cached, live in zip(
                    self._sd["optim"]["param_groups"], optimizer.param_groups, strict=True
                ):
                    cached.update((k, v) for k, v in live.items() if k != "params")
            return self._sd
        sd = AppState(model, optimizer).state_dict()
        self._key, self._sd = (key, sd) if _cacheable(model) else (None, None)
        return sd


def _local(t: Any) -> Any:
    return getattr(t, "_local_tensor", t)


def _fingerprint(model: Any, optimizer: Any) -> list:
    import torch

    out: list = [id(model), id(optimizer)]
    out.extend(
        (_local(t).data_ptr(), t.shape, t.dtype) for t in (*model.parameters(), *model.buffers())
    )
    if optimizer is not None:
        for group in optimizer.param_groups:
            out.append(tuple(map(id, group["params"])))
            out.append(tuple((k, type(v)) for k, v in group.items()))
        for param, st in optimizer.state.items():
            out.append(id(param))
            out.extend(
                (k, _local(v).data_ptr(), v.shape, v.dtype)
                if isinstance(v, torch.Tensor)
                else (k, v)
                for k, v in st.items()
            )
    return out


def _cacheable(model: Any) -> bool:
    from torch import nn

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

    def __init__(self) -> None:
        self.local: Any = None
        self.final: Any = None
        self.metadata: Any = None
        self._planner: Any = None  # set up on `_sd` (the StateDicts result the plan was made of)
        self._sd: Any = None

    def planner(self, sd: dict, rank: int, same: bool | None = None) -> tuple[Any, bool]:
        """A planner set up on `sd` and whether this rank's plan differs from the cached one.
        `same`: `sd` is the StateDicts result, True when its tensors are unchanged (reused); then
        a planner set up on it before is reused, its non-tensor leaves taken afresh. None (an
        async save's staged copy, new each time): the planner is not kept."""
        from torch.distributed.checkpoint import DefaultSavePlanner

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
            or local.items != self.local.items
            or local.planner_data != self.local.planner_data
        )
        self._candidate = (local, p, sd)
        if not changed and same is not None:
            self._planner, self._sd = p, sd
            self._leaves = _leaves(p)
        return p, changed

    def keep(self, final: Any, metadata: Any) -> None:
        """After a full dcp.save succeeded on every rank."""
        self.local, self._planner, self._sd = self._candidate
        self._leaves = _leaves(self._planner)
        self.final, self.metadata = final, metadata

    def clear(self) -> None:
        self.local = self.final = self.metadata = self._planner = self._sd = None


def _leaves(p: Any) -> list[tuple[str, tuple]]:
    """The planner's non-tensor leaves (fqn, path in the state dict): what changes in place."""
    import torch

    return [(k, p.mappings[k]) for k, v in p.state_dict.items() if not isinstance(v, torch.Tensor)]


def _at(obj: Any, path: tuple) -> Any:
    for key in path:
        obj = obj[key]
    return obj


def planner() -> Any:
    """DCP's default planner for a full save (PlanCache decides when one is needed)."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    return DefaultSavePlanner()
