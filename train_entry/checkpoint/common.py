"""What the checkpointer's parts share: the failure every rank agrees on, the DCP holder, the
planner with plan caching."""

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


def planner() -> Any:
    """DCP's default planner, reusing the previous save's plan when the state's layout is unchanged
    (it compares the plans, so a changed model or optimizer is planned afresh)."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    return DefaultSavePlanner(enable_plan_caching=True)
