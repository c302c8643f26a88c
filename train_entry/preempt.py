"""The stop flag agreed by all ranks: the torch-free flag (hpctrain/kernel/stopflag.py: signals,
the batch shell's STOP file, STOP_AT_STEP) plus `agreed()`, an all-reduce MAX so that all ranks
save the same step. train_entry's own loop does not call `agreed()`: it carries `vote()` in the
step's one collective, read one step later (train_entry/stepsync.py), and stops at once on
`reached(step)`. Pass `step=` to `agreed` for STOP_AT_STEP.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hpctrain.kernel import exitcodes, stopflag
from hpctrain.kernel.stopflag import DEFAULT_SIGNALS, die_with_launcher  # noqa: F401  (re-exported)

PREEMPTED_EXIT = exitcodes.PREEMPTED


class StopFlag(stopflag.StopFlag):
    """`install()` once per process, then `agreed(device, step=...)` at every step boundary."""

    def agreed(self, device: torch.device | str = "cpu", step: int | None = None) -> bool:
        """True on every rank when any rank wants to stop. A collective: every rank calls it."""
        mine = self.local(step)
        if not (dist.is_available() and dist.is_initialized()):
            return mine
        flag = torch.tensor([1 if mine else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and not self._raised:
            self.raise_("another rank")
        return bool(flag.item())
