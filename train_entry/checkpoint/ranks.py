"""What every part of a save or a load agrees on across ranks: the process group, one all-reduce
of flags, a broadcast and a gather (a mixin of Checkpointer; every method is a collective)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, overload

from train_entry.checkpoint.base import Base
from train_entry.checkpoint.common import OtherRank, SaveFailed, cause_of

if TYPE_CHECKING:  # the package imports no torch until a Checkpointer is used
    from torch.distributed import ProcessGroup

# Every rank's (rank, (kind, text)) of its failure, or (rank, None): what SaveFailed takes.
Causes = list[tuple[int, tuple[str, str] | None]]


class RankCollectives(Base):
    """The checkpointer's collectives; without a process group each answers for one rank."""

    @staticmethod
    def _dist() -> tuple[Any, int, int]:  # Any: the torch.distributed module, or None
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist, dist.get_rank(), dist.get_world_size()
        return None, 0, 1

    def _barrier(self) -> None:
        dist, _, _ = self._dist()
        if dist is not None:
            dist.barrier()

    def _broadcast(self, obj: Any) -> Any:  # Any: whatever rank 0 sends (pickled)
        dist, _, _ = self._dist()
        if dist is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    @overload
    def _any_rank(self, flag: bool, /, *, group: ProcessGroup | None = None) -> bool: ...
    @overload
    def _any_rank(
        self, flag: bool, first: bool, /, *more: bool, group: ProcessGroup | None = None
    ) -> list[bool]: ...
    def _any_rank(
        self, flag: bool, /, *more: bool, group: ProcessGroup | None = None
    ) -> bool | list[bool]:
        """Whether any rank's `flag` is set (one all-reduce MAX); with `more` flags, a list of
        such answers, all in the same all-reduce."""
        dist, _, _ = self._dist()
        flags = [flag, *more]
        if dist is not None:
            import torch

            nccl = group is None and dist.get_backend() == "nccl"
            t = torch.tensor(flags, dtype=torch.int32, device="cuda" if nccl else "cpu")
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            flags = [bool(x) for x in t.tolist()]
        return flags if more else bool(flags[0])

    def _warn(self, msg: str) -> None:
        if self._dist()[1] == 0:
            self._log(f"WARNING: {msg}")

    def _agree(self, error: BaseException | None, step: int, *flags: bool) -> list[bool]:
        """A barrier that also agrees on failure: when any rank failed, every rank raises SaveFailed
        (a rank that raised alone would leave the others waiting in the next collective). `flags`
        ride along in the same all-reduce; the answer is whether any rank set each one."""
        agreed = self._any_rank(error is not None, *flags, False)
        if agreed[0]:
            raise SaveFailed(step, self.dir, error, self._causes(error))
        return agreed[1:-1]

    def _causes(self, error: BaseException | None, group: ProcessGroup | None = None) -> Causes:
        """Every rank's (kind, text) of its failure, or None: gathered only once the ranks agreed
        that one failed, so each raises the same SaveFailed (and stops, or goes on, together)."""
        dist, _, world = self._dist()
        mine = cause_of(error, self.dir)
        if dist is None:
            return [(0, mine)]
        out: list[tuple[str, str] | None] = [None] * world
        dist.all_gather_object(out, mine, group=group)
        return list(enumerate(out))

    def _agree_on(self, error: BaseException | None, step: int, group: ProcessGroup | None) -> None:
        """`_agree` for a sync save; on an async save's group, every rank raises (the thread's
        own agreement then makes every rank's wait() raise SaveFailed)."""
        if group is None:
            self._agree(error, step)
        elif self._any_rank(error is not None, group=group):
            raise error or OtherRank("another rank failed")

    def _gather(self, obj: Any, group: ProcessGroup | None = None) -> list[Any]:  # Any: pickled
        dist, rank, world = self._dist()
        if dist is None:
            return [obj]
        out: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=group)
        return out or []
