"""What every part of a save or a load agrees on across ranks: one all-reduce of flags, a broadcast
and a gather, and the agreement on failure (every method is a collective)."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar, overload

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from train_entry.checkpoint.common import Causes, OtherRank, SaveFailed, cause_of

T = TypeVar("T")


class Ranks:
    """The checkpointer's collectives; without a process group each answers for one rank.
    `folder`: the checkpoints folder a failure names (SaveFailed)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    @staticmethod
    def live() -> bool:
        """A process group is set up (else this process is the only rank)."""
        return dist.is_available() and dist.is_initialized()

    @property
    def rank(self) -> int:
        return dist.get_rank() if self.live() else 0

    @property
    def world(self) -> int:
        return dist.get_world_size() if self.live() else 1

    def barrier(self) -> None:
        if self.live():
            dist.barrier()

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank (pickled)."""
        if not self.live():
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    @overload
    def any_rank(self, flag: bool, /, *, group: ProcessGroup | None = None) -> bool: ...
    @overload
    def any_rank(
        self, flag: bool, first: bool, /, *more: bool, group: ProcessGroup | None = None
    ) -> list[bool]: ...
    def any_rank(
        self, flag: bool, /, *more: bool, group: ProcessGroup | None = None
    ) -> bool | list[bool]:
        """Whether any rank's `flag` is set (one all-reduce MAX); with `more` flags, a list of
        such answers, all in the same all-reduce."""
        flags = [flag, *more]
        if self.live():
            nccl = group is None and dist.get_backend() == "nccl"
            t = torch.tensor(flags, dtype=torch.int32, device="cuda" if nccl else "cpu")
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            flags = [bool(x) for x in t.tolist()]
        return flags if more else bool(flags[0])

    def agree(self, error: BaseException | None, step: int, *flags: bool) -> list[bool]:
        """A barrier that also agrees on failure: when any rank failed, every rank raises SaveFailed
        (a rank that raised alone would leave the others waiting in the next collective). `flags`
        ride along in the same all-reduce; the answer is whether any rank set each one."""
        agreed = self.any_rank(error is not None, *flags, False)
        if agreed[0]:
            raise SaveFailed(step, self.folder, error, self.causes(error))
        return agreed[1:-1]

    def causes(self, error: BaseException | None, group: ProcessGroup | None = None) -> Causes:
        """Every rank's (kind, text) of its failure, or None: gathered only once the ranks agreed
        that one failed, so each raises the same SaveFailed (and stops, or goes on, together)."""
        mine = cause_of(error, self.folder)
        if not self.live():
            return [(0, mine)]
        out: list[tuple[str, str] | None] = [None] * self.world
        dist.all_gather_object(out, mine, group=group)
        return list(enumerate(out))

    def agree_on(self, error: BaseException | None, step: int, group: ProcessGroup | None) -> None:
        """`agree` for a sync save; on an async save's group, every rank raises (the thread's
        own agreement then makes every rank's wait() raise SaveFailed)."""
        if group is None:
            self.agree(error, step)
        elif self.any_rank(error is not None, group=group):
            raise error or OtherRank("another rank failed")

    def gather(self, obj: T, group: ProcessGroup | None = None) -> list[T]:
        """Every rank's `obj` on rank 0 (pickled); an empty list on the others."""
        if not self.live():
            return [obj]
        out: list[T] | None = [obj] * self.world if self.rank == 0 else None  # filled in
        dist.gather_object(obj, out, dst=0, group=group)
        return out or []
