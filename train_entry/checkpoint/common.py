"""What the checkpointer's parts share: the failure every rank agrees on, the DCP holder, the
state dict and save plan caches."""

from __future__ import annotations

import errno
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing the package imports no torch
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.metadata import Metadata
    from torch.distributed.checkpoint.planner import SavePlan

# Where a leaf lies in a nested state dict: the keys and list indices down to it (DCP's OBJ_PATH).
ObjPath = tuple[str | int, ...]

LOW_SPACE = 64 << 20  # a save that failed with less free than this failed for lack of space
SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
# I/O faults that may pass by the next interval: a flaky or failing-over network filesystem
TRANSIENT_ERRNOS = {
    errno.EIO,
    errno.EAGAIN,
    errno.EINTR,
    errno.EBUSY,
    errno.ETIMEDOUT,
    errno.ESTALE,
    errno.ENOLCK,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ECOMM,
    errno.EREMOTEIO,
}
SPACE, TRANSIENT, FATAL = "space", "transient", "fatal"


def _inner(exc: BaseException) -> list[BaseException]:
    """The rank failures inside DCP's CheckpointException (each an exception, or one with its
    traceback), else the exception itself."""
    if type(exc).__name__ != "CheckpointException":
        return [exc]
    out = []
    for item in (getattr(exc, "failures", None) or {}).values():
        item = item[0] if isinstance(item, tuple) and item else item
        if isinstance(item, BaseException):
            out.append(item)
    return out or [exc]


def classify(exc: BaseException, folder: Path | None = None) -> tuple[str, str]:
    """(kind, text) of a save's failure. kind: SPACE (ENOSPC/EDQUOT: free space, then the next
    interval saves), TRANSIENT (an I/O fault that may pass: the next interval tries again), FATAL
    (anything else: an ImportError, a TypeError, EACCES, ... fails the same way every time, so the
    run stops at once). text: one line, `Type: message`."""
    if isinstance(exc, SaveFailed):  # an async save's failure, raised again at wait()
        return exc.kind, exc.detail
    kinds = []
    for e in _inner(exc):
        code = getattr(e, "errno", None)
        said = str(e)
        if code in SPACE_ERRNOS or "No space left" in said or "Disk quota exceeded" in said:
            kinds.append((SPACE, e))
        elif isinstance(e, OSError) and code in TRANSIENT_ERRNOS:
            kinds.append((TRANSIENT, e))
        elif isinstance(e, (OSError, RuntimeError)) and folder is not None and _low(folder):
            # torch's zip writer (DeepSpeed's torch.save) hides ENOSPC: ask the disk
            kinds.append((SPACE, e))
        else:
            kinds.append((FATAL, e))
    rank = {FATAL: 0, SPACE: 1, TRANSIENT: 2}
    kind, e = min(kinds, key=lambda k: rank[k[0]])
    return kind, _line(e)


def _low(folder: Path) -> bool:
    try:
        return shutil.disk_usage(folder if folder.exists() else folder.parent).free < LOW_SPACE
    except OSError:
        return False


def _line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        where = f": {e.filename}" if e.filename else ""
        return f"{type(e).__name__}: [Errno {e.errno}] {e.strerror}{where}"
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300]}" if lines else type(e).__name__


class OtherRank(RuntimeError):
    """This rank stopped its part of a save because another rank failed (that one says why)."""


def cause_of(error: BaseException | None, folder: Path) -> tuple[str, str] | None:
    """What a rank tells the others about its failure (plain strings: exceptions may not pickle)."""
    return None if error is None or isinstance(error, OtherRank) else classify(error, folder)


class SaveFailed(Exception):
    """A checkpoint could not be written. Raised on EVERY rank at once (the ranks agree on it at
    each step of the save), with the same `kind` (common.classify) and `reason` on every rank:
    `causes` are every failed rank's (kind, text), gathered once the ranks agreed that one failed.
    SPACE and TRANSIENT failures let the run go on (the next interval saves again); FATAL stops it."""

    def __init__(
        self,
        step: int,
        folder: Path,
        cause: BaseException | None,
        causes: list[tuple[int, tuple[str, str] | None]] | None = None,
    ) -> None:
        self.step, self.folder, self.cause = step, folder, cause
        if causes is None:  # one process: this rank's own error
            causes = [(0, cause_of(cause, folder))]
        found = [(r, c) for r, c in causes if c is not None]
        order = {FATAL: 0, SPACE: 1, TRANSIENT: 2}
        where = ""
        if found:
            rank, (self.kind, self.detail) = min(found, key=lambda rc: (order[rc[1][0]], rc[0]))
            where = "" if len(causes) == 1 else f" (rank {rank})"
        else:  # no rank said why (cannot happen when the ranks agree): not known to repeat
            self.kind, self.detail = TRANSIENT, "a rank failed without saying why"
        self.no_space = self.kind == SPACE
        # a full disk needs no exception name (torch may hide ENOSPC in a RuntimeError): the
        # exception's own line stays in `detail`, which the run's events.jsonl keeps
        self.reason = ("no space left on the device" if self.no_space else self.detail) + where
        super().__init__(f"checkpoint of step {step} into {folder} failed: {self.reason}")


# Any: torch objects (tensors, modules, optimizers, state dicts)
def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BaseException | None:
    """Run one step of a save on this rank: None, or the error it raised (for _agree, which makes
    every rank raise SaveFailed together: a rank that raised alone would leave the others waiting
    in the next collective). KeyboardInterrupt and SystemExit go on up."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        return exc
    except BaseException as exc:
        # DCP wraps each rank's failure in a CheckpointException (a BaseException, on every rank)
        if type(exc).__name__ == "CheckpointException":
            return exc
        raise
    return None


def stderr(msg: str) -> None:
    print(f"[hpctrain checkpoint] {msg}", file=sys.stderr, flush=True)


class AppState:
    """DCP Stateful holder: model + optimizer through get/set_state_dict (FQNs without wrappers).

    `flat`: the optimizer state flattened per parameter name (param groups too), which is what a
    pipeline-parallel run needs: each pp rank holds other parameters, so one shared `param_groups`
    list (saved once, by the lowest rank) would not describe them. Runs on a device mesh save flat;
    a load reads whichever form the checkpoint has (`is_flat`)."""

    # Any: torch objects (tensors, modules, optimizers, state dicts)
    def __init__(self, model: Any, optimizer: Any, flat: bool = False) -> None:
        self.model, self.optimizer, self.flat = model, optimizer, flat

    def _options(self) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(flatten_optimizer_state_dict=True) if self.flat else None

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self._options())
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self.optimizer is None:
            set_model_state_dict(self.model, sd["model"])
        else:
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=sd["model"],
                optim_state_dict=sd["optim"],
                options=self._options(),
            )


# Any: torch objects (tensors, modules, optimizers, state dicts)
def is_flat(metadata: Any) -> bool:
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
        self._key: Any = None  # Any: torch objects (tensors, modules, optimizers, state dicts)
        self._sd: dict[str, Any] | None = None
        self.reused = False  # the last get() returned the previous state dict (same tensors)

    # Any: torch objects (tensors, modules, optimizers, state dicts)
    def get(self, model: Any, optimizer: Any, flat: bool = False) -> dict[str, Any]:
        if flat:  # flattened param groups are keyed by name: built afresh each save (no cache)
            self.reused, self._key, self._sd = False, None, None
            return AppState(model, optimizer, flat=True).state_dict()
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


# Any: torch objects (tensors, modules, optimizers, state dicts)
def _fingerprint(model: Any, optimizer: Any) -> list[object]:
    import torch

    from train_entry.compat import local_tensor

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


# Any: torch objects (tensors, modules, optimizers, state dicts)
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

    _leaves: list[tuple[str, ObjPath]]  # the cached planner's non-tensor leaves
    _candidate: tuple[SavePlan, DefaultSavePlanner, dict[str, Any]]  # the last plan made

    def __init__(self) -> None:
        self.local: SavePlan | None = None
        self.final: SavePlan | None = None
        self.metadata: Metadata | None = None
        # set up on `_sd` (the StateDicts result the plan was made of)
        self._planner: DefaultSavePlanner | None = None
        self._sd: dict[str, Any] | None = None

    def planner(
        self, sd: dict[str, Any], rank: int, same: bool | None = None
    ) -> tuple[DefaultSavePlanner, bool]:
        """A planner set up on `sd` and whether this rank's plan differs from the cached one.
        `same`: `sd` is the StateDicts result, True when its tensors are unchanged (reused); then
        a planner set up on it before is reused, its non-tensor leaves taken afresh. None (an
        async save's staged copy, new each time): the planner is not kept."""
        from train_entry.compat import DefaultSavePlanner

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
    import torch

    return [(k, p.mappings[k]) for k, v in p.state_dict.items() if not isinstance(v, torch.Tensor)]


def _at(obj: Any, path: ObjPath) -> Any:  # Any: a leaf of a torch state dict
    for key in path:
        obj = obj[key]
    return obj


def planner() -> DefaultSavePlanner:
    """DCP's default planner for a full save (PlanCache decides when one is needed)."""
    from train_entry.compat import DefaultSavePlanner

    return DefaultSavePlanner()
