"""Async saves: the loop is blocked only for the state dict (cached while live) and the copy of
model buffers; the parameters and optimizer state (which only the optimizer's step changes) are
copied into reusable CPU buffers (pinned, on a side stream, on GPU) on the save's writer thread, and
the optimizer's next step waits for that copy (a pre-step hook); the write (with the cached plan),
the checksums, rank 0's commit and the agreement on the outcome follow on the same thread, their
collectives on a gloo group of their own. `wait()` joins it and raises SaveFailed on every rank when
any failed (they all got the same answer)."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train_entry.checkpoint.base import Texts
from train_entry.checkpoint.common import OtherRank, SaveFailed, attempt
from train_entry.checkpoint.ranks import Causes
from train_entry.checkpoint.steps import SaveSteps

if TYPE_CHECKING:  # the package imports no torch until a Checkpointer is used
    import torch

    from train_entry.state import TrainState


@dataclass
class _Pending:
    """An async save in flight: its writer thread (staging copy, DCP write, rank 0's commit) and
    the event the optimizer's next step waits for (the staging copy is done)."""

    staging: Path
    step: int
    started: float
    staged: threading.Event
    done: threading.Event
    error: BaseException | None = None
    failed: bool = False  # agreed by every rank's writer thread: some rank's save failed
    # then every rank's (kind, text) or None (SaveFailed)
    causes: Causes | None = None
    phases: dict[str, float] = field(default_factory=dict)  # always given


class AsyncSaves(SaveSteps):
    """The async half of Checkpointer (a mixin: it uses the checkpointer's helpers)."""

    def _async_setup(self) -> None:
        dist, _, _ = self._dist()
        if dist is not None and self._async_group is None:
            # The background write runs collectives; keep them off the training group.
            self._async_group = dist.new_group(backend="gloo")
        if self._writer is None:
            # one writer thread for every async save: a thread start per save cost the loop
            # milliseconds (the new thread takes the GIL before the call returns)
            self._jobs = queue.SimpleQueue()
            self._writer = threading.Thread(
                target=self._writer_loop, daemon=True, name="hpctrain-async-save"
            )
            self._writer.start()
        if self._stager is None:
            # Import here what the writer thread uses: an import on that thread holds the GIL
            # while the loop wants it back (measured: +30 ms on the first save's call).
            import train_entry.checkpoint.writer  # noqa: F401
            from train_entry.checkpoint.staging import Stager
            from train_entry.compat import warm_imports

            warm_imports()

            self._stager = Stager()

    def _save_async(
        self,
        state: TrainState,
        holder: dict[str, Any],  # Any: a torch state dict (tensors and plain leaves)
        texts: Texts,
        final: Path,
        staging: Path,
        t0: float,
        phases: dict[str, float],
    ) -> Path:
        """Return as soon as the model buffers are copied; parameters and optimizer state are
        copied by the writer thread before the optimizer's next step (which waits for it)."""
        _, rank, world = self._dist()
        self._async_setup()
        assert self._stager is not None  # made by _async_setup
        t = time.perf_counter()
        self._stager.begin(
            holder,
            lambda: deferrable(state.model, state.optimizer),
            same=self._state_dicts.reused,
        )
        phases["staging_now_s"] = time.perf_counter() - t
        t = time.perf_counter()
        pending = _Pending(
            staging,
            state.step,
            time.monotonic(),
            threading.Event(),
            threading.Event(),
            phases=phases,
        )
        self._hook(state.optimizer)
        self._pending = pending
        self._jobs.put((pending, texts, final, rank, world))
        phases["start_s"] = time.perf_counter() - t
        self._last_step, self._last_time = state.step, time.monotonic()
        self.timings.append(
            {
                "step": state.step,
                "async": True,
                "blocked_s": time.perf_counter() - t0,
                "phases": phases,
            }
        )
        return final

    def _writer_loop(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                self._write_async(*job)
            finally:
                job[0].done.set()

    def _write_async(self, p: _Pending, texts: Texts, final: Path, rank: int, world: int) -> None:
        """The writer thread of an async save (collectives on the save's own gloo group)."""
        from train_entry.checkpoint.writer import HashingWriter, SyncedFiles

        group = self._async_group
        staged: dict[str, Any] | None = None  # Any: a torch state dict, staged on CPU
        t = time.perf_counter()
        try:
            assert self._stager is not None  # made by _async_setup before the job was queued
            staged = self._stager.finish()
        except BaseException as exc:  # noqa: BLE001 - reported by wait()
            p.error = exc
        finally:
            p.phases["staging_s"] = time.perf_counter() - t
            p.staged.set()
        try:
            t = time.perf_counter()
            plan, changed = (
                self._plans.planner(staged, rank) if staged is not None else (None, True)
            )
            p.phases["planning_s"] = time.perf_counter() - t
            t = time.perf_counter()
            prepared = attempt(self._prepare, final, p.staging) if rank == 0 else None
            not_prepared, not_staged, replan = self._any_rank(
                prepared is not None, staged is None, changed, group=group
            )
            if not_prepared:
                raise prepared or OtherRank("rank 0 could not prepare the staging folder")
            p.phases["prepare_s"] = time.perf_counter() - t
            side = SyncedFiles(p.staging)
            error = attempt(self._write_texts, side, texts) or p.error
            writer, results, entries = None, None, None
            if not_staged or staged is None:  # the same: not_staged says whether any rank's is None
                error = error or OtherRank("another rank could not stage its state")
            else:
                writer = HashingWriter(p.staging)
                failed, results = self._write_weights(
                    writer, staged, plan, replan, p.phases, group=group
                )
                error = failed or error
                entries = writer.entries
            if entries is not None:
                entries = {**side.entries, **entries}
            self._finish(
                p.staging,
                final,
                p.step,
                world,
                rank,
                entries,
                error,
                p.phases,
                group,
                side,
                writer,
                results,
            )
        except BaseException as exc:  # noqa: BLE001 - reported by wait() on the main thread
            p.error = exc
        finally:
            # every rank's thread ends here, so every rank learns the same outcome
            p.failed = self._any_rank(p.error is not None, group=group)
            if p.failed:  # why, from every rank, so each raises the same SaveFailed at wait()
                p.causes = self._causes(p.error, group)

    def _hook(self, optimizer: torch.optim.Optimizer | None) -> None:
        """The optimizer's step waits until an async save has copied what the step changes."""
        if optimizer is None or self._hooked is optimizer:
            return

        def wait_for_staging(*_: object) -> None:
            p = self._pending
            if p is not None and not p.staged.is_set():
                t = time.perf_counter()
                p.staged.wait()
                waited = time.perf_counter() - t
                for row in reversed(self.timings):
                    if row["step"] == p.step:
                        row["hook_wait_s"] = row.get("hook_wait_s", 0.0) + waited
                        row["blocked_s"] += waited
                        break

        optimizer.register_step_pre_hook(wait_for_staging)
        self._hooked = optimizer

    def wait(self) -> None:
        """Block until the pending async save is written and committed (on every rank), and any
        pruned folder deleted; SaveFailed on every rank when the save failed on any."""
        pending, self._pending = self._pending, None
        if pending is None:
            self._join_purge()
            return
        t0 = time.monotonic()
        pending.staged.wait()
        pending.done.wait()
        self._join_purge()
        for row in reversed(self.timings):
            if row["step"] == pending.step:
                row["total_s"] = time.monotonic() - pending.started
                row["wait_blocked_s"] = time.monotonic() - t0
                row["blocked_s"] += row["wait_blocked_s"]
                break
        if pending.failed:
            self._failed(pending.staging, self._dist()[1])
            self._last_step = None
            raise SaveFailed(pending.step, self.dir, pending.error, pending.causes)


def deferrable(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> set[int]:
    """Storage addresses of what only the optimizer's step changes: parameters (a DTensor's local
    shard) and optimizer state. An async save copies these on its writer thread."""
    import torch

    from train_entry.compat import local_tensor

    def ptr(t: torch.Tensor) -> int:
        return local_tensor(t).data_ptr()

    out = {ptr(p) for p in model.parameters()}
    if optimizer is not None:
        for st in optimizer.state.values():
            out.update(ptr(v) for v in st.values() if isinstance(v, torch.Tensor))
    return out
