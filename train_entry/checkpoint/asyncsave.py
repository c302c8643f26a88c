"""Async saves: the loop is blocked only for the state dict (cached while live) and the copy of
model buffers; the parameters and optimizer state (which only the optimizer's step changes) are
copied into reusable CPU buffers (pinned, on a side stream, on GPU) on the save's writer thread, and
the optimizer's next step waits for that copy (a pre-step hook); the write (with the cached plan),
the checksums, rank 0's commit and the agreement on the outcome follow on the same thread, their
collectives on a gloo group of their own. `wait()` joins it; every rank gets the same answer."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hpctrain.kernel import partners
from train_entry.checkpoint.commit import Commit
from train_entry.checkpoint.common import Causes, OtherRank, attempt
from train_entry.checkpoint.ranks import Ranks
from train_entry.checkpoint.staging import Stager
from train_entry.checkpoint.statedict import PlanCache, StateDict
from train_entry.checkpoint.steps import (
    Target,
    Texts,
    Timing,
    Written,
    prepare,
    write_texts,
    write_weights,
)
from train_entry.checkpoint.writer import HashingWriter, SyncedFiles
from train_entry.compat import local_tensor, warm_imports
from train_entry.state import TrainState


@dataclass
class Pending:
    """An async save in flight: its writer thread (staging copy, DCP write, rank 0's commit) and
    the event the optimizer's next step waits for (the staging copy is done)."""

    target: Target
    started: float
    staged: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    failed: bool = False  # agreed by every rank's writer thread: some rank's save failed
    # then every rank's (kind, text) or None (SaveFailed)
    causes: Causes | None = None
    phases: dict[str, float] = field(default_factory=dict)


class AsyncWriter:
    """The writer thread of async saves and what it keeps between them (the staging buffers, the
    gloo group of its collectives); `start` hands it a save, `wait` joins it."""

    def __init__(
        self,
        *,
        ranks: Ranks,
        plans: PlanCache,
        commit: Commit,
        timings: list[Timing],
        log: Callable[[str], None],
    ) -> None:
        self._ranks, self._plans, self._commit = ranks, plans, commit
        self._timings, self._log = timings, log
        self.pending: Pending | None = None
        self._hooked: torch.optim.Optimizer | None = None  # its step waits for a staging copy
        # The background write runs collectives; keep them off the training group. Lazy: only
        # the pairs its collectives use connect (ring neighbours; DCP's plan gather and rank 0's
        # commit: rank 0 with every rank), not a full mesh (issue 37; torch < 2.8: the mesh)
        with partners.lazy_gloo():
            self._group = dist.new_group(backend="gloo") if ranks.live() else None
        # one writer thread for every async save: a thread start per save cost the loop
        # milliseconds (the new thread takes the GIL before the call returns)
        self._jobs: queue.SimpleQueue[tuple[Pending, Texts]] = queue.SimpleQueue()
        threading.Thread(target=self._loop, daemon=True, name="hpctrain-async-save").start()
        # Imported now, not on the writer thread: an import there holds the GIL while the loop
        # wants it back (measured: +30 ms on the first save's call).
        warm_imports()
        self._stager = Stager()

    def start(
        self,
        state: TrainState,
        *,
        sd: StateDict,
        same: bool,
        target: Target,
        texts: Texts,
        phases: dict[str, float],
    ) -> None:
        """Return as soon as the model buffers are copied; parameters and optimizer state are
        copied by the writer thread before the optimizer's next step (which waits for it).
        `same`: `sd` is the last save's state dict (StateDicts.reused)."""
        t = time.perf_counter()
        self._stager.begin(sd, lambda: deferrable(state.model, state.optimizer), same=same)
        phases["staging_now_s"] = time.perf_counter() - t
        t = time.perf_counter()
        pending = Pending(target=target, started=time.monotonic(), phases=phases)
        self._hook(state.optimizer)
        self.pending = pending
        self._jobs.put((pending, texts))
        phases["start_s"] = time.perf_counter() - t

    def wait(self) -> Pending | None:
        """Block until the pending save's thread is done (on every rank); that save, or None."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.staged.wait()
            pending.done.wait()
        return pending

    def _loop(self) -> None:
        while True:
            pending, texts = self._jobs.get()
            try:
                self._write(pending, texts)
            finally:
                pending.done.set()

    def _write(self, p: Pending, texts: Texts) -> None:
        """The writer thread of an async save (collectives on the save's own gloo group)."""
        staged: StateDict | None = None  # the state dict, staged on CPU
        t = time.perf_counter()
        try:
            staged = self._stager.finish()
        except BaseException as exc:  # noqa: BLE001 - reported by wait()
            p.error = exc
        finally:
            p.phases["staging_s"] = time.perf_counter() - t
            p.staged.set()
        try:
            self._write_staged(p, staged=staged, texts=texts)
        except BaseException as exc:  # noqa: BLE001 - reported by wait() on the main thread
            p.error = exc
        finally:
            # every rank's thread ends here, so every rank learns the same outcome
            p.failed = self._ranks.any_rank(p.error is not None, group=self._group)
            if p.failed:  # why, from every rank, so each raises the same SaveFailed at wait()
                p.causes = self._ranks.causes(p.error, self._group)

    def _write_staged(self, p: Pending, *, staged: StateDict | None, texts: Texts) -> None:
        target, group = p.target, self._group
        t = time.perf_counter()
        plan, changed = (
            self._plans.planner(staged, target.rank) if staged is not None else (None, True)
        )
        p.phases["planning_s"] = time.perf_counter() - t
        t = time.perf_counter()
        prepared = attempt(lambda: prepare(target, log=self._log)) if target.rank == 0 else None
        not_prepared, not_staged, replan = self._ranks.any_rank(
            prepared is not None, staged is None, changed, group=group
        )
        if not_prepared:
            raise prepared or OtherRank("rank 0 could not prepare the staging folder")
        p.phases["prepare_s"] = time.perf_counter() - t
        side = SyncedFiles(target.staging)
        error = attempt(lambda: write_texts(side, texts)) or p.error
        if not_staged or staged is None:  # the same: not_staged says whether any rank's is None
            written = Written(side, error or OtherRank("another rank could not stage its state"))
        else:
            writer = HashingWriter(target.staging, tail=side.tail)
            failed, results = write_weights(
                writer,
                sd=staged,
                plan=plan,
                replan=replan,
                plans=self._plans,
                phases=p.phases,
                group=group,
            )
            written = Written(side, failed or error, writer=writer, results=results)
        self._commit.finish(target, written=written, phases=p.phases, group=group)

    def _hook(self, optimizer: torch.optim.Optimizer | None) -> None:
        """The optimizer's step waits until an async save has copied what the step changes."""
        if optimizer is None or self._hooked is optimizer:
            return

        def wait_for_staging(*_: object) -> None:
            p = self.pending
            if p is not None and not p.staged.is_set():
                t = time.perf_counter()
                p.staged.wait()
                waited = time.perf_counter() - t
                for row in reversed(self._timings):
                    if row["step"] == p.target.step:
                        row["hook_wait_s"] = row.get("hook_wait_s", 0.0) + waited
                        row["blocked_s"] += waited
                        break

        optimizer.register_step_pre_hook(wait_for_staging)
        self._hooked = optimizer


def deferrable(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> set[int]:
    """Storage addresses of what only the optimizer's step changes: parameters (a DTensor's local
    shard) and optimizer state. An async save copies these on its writer thread."""

    def ptr(t: torch.Tensor) -> int:
        return local_tensor(t).data_ptr()

    out = {ptr(p) for p in model.parameters()}
    if optimizer is not None:
        for st in optimizer.state.values():
            out.update(ptr(v) for v in st.values() if isinstance(v, torch.Tensor))
    return out
