"""In-memory snapshots of the trainer's state for in-job restarts (issue 24; docs/recovery.md).

When to take one, the exchange with the partner rank on another node and the choice at a restart
are shared with the runtime API (hpctrain/runtime/recovery.py: `Snapshots`, `Exchange`, `choose`);
this module says what a snapshot of the trainer holds and how it loads: the same state a disk
checkpoint holds (model and optimizer shards, scheduler, scaler, RNG, the data position).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypedDict, cast

import torch

from hpctrain.runtime.recovery import enabled as enabled  # public here too: the trainer's switch
from train_entry.checkpoint.statedict import AppState, StateDict, StateDicts
from train_entry.compat import local_tensor
from train_entry.state import LoopState, RngState, TrainState, capture_rng, restore_rng


class Payload(TypedDict):
    """One snapshot of the trainer."""

    app: object  # the model's and optimizer's state dict, DTensors as their local tensors
    loop: LoopState
    rng: RngState
    step: int


def for_train_state(
    state: TrainState, flat: bool
) -> tuple[Callable[[], Payload], Callable[[Mapping[str, object]], int]]:
    """What a snapshot of the trainer holds, and how it loads: what a disk checkpoint holds (the
    model and optimizer through DCP's state dict: each rank's own shards, DTensors as their local
    tensors; the RNG's numpy state as an array). Snapshots copies and encodes it (frozen.py: plain
    tensors, arrays and containers only) and hands `apply` the state it thawed."""
    dicts = StateDicts()

    def local(obj: object) -> object:
        if isinstance(obj, torch.Tensor):
            return local_tensor(obj).detach()
        if isinstance(obj, dict):
            return {k: local(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(local(v) for v in obj)
        return obj

    def payload() -> Payload:
        return {
            "app": local(dicts.get(state.model, state.optimizer, flat=flat)),
            "loop": state.loop_state(),
            "rng": capture_rng(),
            "step": state.step,
        }

    def fill(live: object, saved: object) -> object:
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

    def apply(thawed: Mapping[str, object]) -> int:
        saved = cast(Payload, thawed)  # what payload() gave, frozen and thawed
        app = AppState(state.model, state.optimizer, flat)
        app.load_state_dict(cast(StateDict, fill(app.state_dict(), saved["app"])))
        state.load_loop_state(saved["loop"])
        restore_rng(saved["rng"])
        return int(saved["step"])

    return payload, apply
