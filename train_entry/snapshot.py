"""In-memory snapshots of the trainer's state for in-job restarts (issue 24; docs/recovery.md).

When to take one, the exchange with the partner rank on the next node and the choice at a restart
are shared with the runtime API (hpctrain/runtime/recovery.py: `Snapshots`, `Exchange`, `choose`);
this module says what a snapshot of the trainer holds and how it loads: the same state a disk
checkpoint holds (model and optimizer shards, scheduler, scaler, RNG, the data position).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hpctrain.runtime.recovery import enabled as enabled  # public here too: the trainer's switch
from train_entry.state import TrainState, capture_rng, restore_rng


def for_train_state(
    state: TrainState, flat: bool
) -> tuple[Callable[[], dict[str, Any]], Callable[[Any], int]]:
    """What a snapshot of the trainer holds, and how it loads: what a disk checkpoint holds (the
    model and optimizer through DCP's state dict: each rank's own shards, DTensors as their local
    tensors; the RNG's numpy state as an array). Snapshots copies and encodes it (frozen.py: plain
    tensors, arrays and containers only) and hands `apply` the state it thawed."""
    from train_entry.checkpoint.common import AppState, StateDicts
    from train_entry.compat import local_tensor

    dicts = StateDicts()

    def local(obj: Any) -> Any:  # Any: a state dict's leaves
        if isinstance(obj, torch.Tensor):
            return local_tensor(obj).detach()
        if isinstance(obj, dict):
            return {k: local(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(local(v) for v in obj)
        return obj

    def payload() -> dict[str, Any]:
        return {
            "app": local(dicts.get(state.model, state.optimizer, flat=flat)),
            "loop": state.loop_state(),
            "rng": capture_rng(),
            "step": state.step,
        }

    def fill(live: Any, saved: Any) -> Any:  # Any: a state dict's leaves
        if isinstance(live, torch.Tensor) and isinstance(saved, torch.Tensor):
            local_tensor(live).copy_(saved)
            return live
        if isinstance(live, dict) and isinstance(saved, dict):
            return {k: fill(live[k], v) if k in live else v for k, v in saved.items()}
        if (
            isinstance(live, (list, tuple))
            and isinstance(saved, (list, tuple))
            and len(live) == len(saved)
        ):
            return type(live)(fill(a, b) for a, b in zip(live, saved, strict=True))
        return saved

    def apply(saved: Any) -> int:  # Any: the payload's dict, thawed
        app = AppState(state.model, state.optimizer, flat)
        app.load_state_dict(fill(app.state_dict(), saved["app"]))
        state.load_loop_state(saved["loop"])
        restore_rng(saved["rng"])
        return int(saved["step"])

    return payload, apply
