"""The state every part of the Checkpointer shares, declared once so that each mixin (load.py,
asyncsave.py, prune.py, ranks.py, steps.py) is type-checked against it. Checkpointer.__init__ sets
every attribute; the declarations here create none (annotations only)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the package imports no torch until a Checkpointer is used
    from torch.distributed import ProcessGroup

    from train_entry.checkpoint.asyncsave import _Pending
    from train_entry.checkpoint.common import PlanCache, StateDicts
    from train_entry.checkpoint.staging import Stager

# A save's side files: {relative path: text, or a function giving it when written (async saves)}.
Texts = dict[str, "str | Callable[[], str]"]
# One async save handed to the writer thread: (pending, side texts, final folder, rank, world).
AsyncJob = tuple["_Pending", Texts, Path, int, int]


class Base:
    """Checkpointer's attributes (see Checkpointer.__init__ for what each holds)."""

    dir: Path
    strategy: str
    every_steps: int | None
    every_minutes: float | None
    keep: int
    async_save: bool
    _log: Callable[[str], None]
    _last_time: float
    _last_step: int | None
    _pending: _Pending | None
    _async_group: ProcessGroup | None
    _stager: Stager | None
    _writer: threading.Thread | None
    _jobs: queue.SimpleQueue[AsyncJob]
    _hooked: object  # the optimizer whose step waits for an async staging copy, or None
    _state_dicts: StateDicts
    _plans: PlanCache
    _purging: threading.Thread | None
    timings: list[dict[str, Any]]  # Any: JSON rows of mixed values (floats, bools, a phases dict)
