"""The Checkpointer: saves and loads TrainState atomically (the package docstring has the order of
a save; docs/checkpoint-resume.md the whole story). Every method is called by every rank at the
same point of the loop (they are collectives).

This module holds the triggers and the sync save; its parts by job: steps.py (the steps sync and
async saves share), load.py (load_latest), asyncsave.py (async saves), prune.py (dropping old
folders), ranks.py (the collectives), base.py (the attributes they share)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.checkpoint import staging_name, step_name
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.strategies import engine_checkpoint
from train_entry.checkpoint.asyncsave import AsyncSaves
from train_entry.checkpoint.common import (
    PlanCache,
    SaveFailed,
    StateDicts,
    attempt,
    stderr,
)
from train_entry.checkpoint.load import Loading
from train_entry.checkpoint.prune import Pruning
from train_entry.checkpoint.ranks import RankCollectives

if TYPE_CHECKING:  # the package imports no torch until a Checkpointer is used
    from train_entry.state import TrainState

STRATEGIES = strategy_names.NAMES


class Checkpointer(Loading, AsyncSaves, Pruning, RankCollectives):
    """Saves and loads TrainState atomically; see the module docstring and docs/checkpoint-resume.md.

    Every method is called by every rank at the same point of the loop (they are collectives).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        strategy: str,
        every_steps: int | None = None,
        every_minutes: float | None = None,
        keep: int = 2,
        async_save: bool = False,
        log: Callable[[str], None] | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise UserError(
                f"checkpoint: unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}"
            )
        if keep < 2:
            raise UserError(
                f"checkpoint.keep is {keep}: keep at least 2 (the newest may be half "
                "written when the job is killed); set checkpoint.keep: 2"
            )
        self.dir = Path(run_dir).resolve() / "checkpoints"
        self.strategy = strategy
        self.every_steps = every_steps or None
        self.every_minutes = every_minutes or None
        self.keep = keep
        self.async_save = bool(async_save) and strategy_names.info(strategy).async_save
        self._log = log or stderr
        self._last_time = time.monotonic()
        self._last_step = None
        self._pending = None  # the async save in flight
        self._async_group = None  # async saves: their collectives' own gloo group
        self._stager = None  # async saves: CPU copies of the state, kept between saves
        self._writer = None  # async saves: the one writer thread
        self._hooked = None  # the optimizer whose step waits for an async staging copy
        self._state_dicts = StateDicts()  # the last save's state dict, reused while still live
        self._plans = PlanCache()  # the last save's DCP plan, reused while unchanged
        self._purging = None  # deleting pruned folders
        self.timings = []  # per save: step, blocked_s (training time lost), total_s,
        #                                 phases (seconds per phase; docs/checkpoint-resume.md)
        if self.async_save:
            self._async_setup()  # here, not in the first save's blocked time

    # ------------------------------------------------------------ save
    def maybe_save(self, state: TrainState, *, last: bool = False) -> bool:
        """Save if a trigger fires (every N steps, every T minutes agreed across ranks, or `last`)."""
        due = last or bool(self.every_steps and state.step % self.every_steps == 0)
        if not due and self.every_minutes:
            # Clocks differ per rank: any rank past the interval makes every rank save this step.
            due = self._any_rank(time.monotonic() - self._last_time >= self.every_minutes * 60)
        if not due or state.step == self._last_step:
            return False
        self.save(state, sync=not self.async_save)
        return True

    def save(self, state: TrainState, *, sync: bool = True) -> Path:
        """Write a checkpoint of `state`. sync=False (DCP only) returns once the tensors are staged;
        the write and the commit finish in the background and `wait()` waits for them.

        A save that cannot be written (a full disk) raises SaveFailed on every rank together: the
        half-written staging folder is removed, `latest` and the older checkpoints are untouched,
        and the next interval tries again (docs/checkpoint-resume.md, "A full disk")."""
        self.wait()  # one save at a time: the previous one is committed before this starts
        _, rank, _ = self._dist()
        staging = self.dir / staging_name(state.step)
        try:
            return self._save(state, sync=sync)
        except SaveFailed:
            self._failed(staging, rank)
            raise

    def _save(self, state: TrainState, *, sync: bool) -> Path:
        """One save: the state dict (cached while live), the save plan (cached while unchanged),
        prepare (rank 0), side files, the weights (DCP through HashingWriter, or the DeepSpeed
        engine), every rank's file checksums gathered to rank 0, rank 0's commit. The ranks agree
        on failure (and on whether to plan afresh) after the prepare and at the end."""
        from train_entry.checkpoint.writer import HashingWriter, SyncedFiles

        _, rank, world = self._dist()
        t0 = time.perf_counter()
        name = step_name(state.step)
        final, staging = self.dir / name, self.dir / staging_name(state.step)
        phases: dict[str, float] = {}
        dcp_state = not engine_checkpoint(self.strategy)
        holder: dict[str, Any] = {}  # Any: a torch state dict (tensors and plain leaves)
        if dcp_state:
            holder = self._state_dicts.get(
                state.model, state.optimizer, flat=getattr(state, "flat_optim", False)
            )
            phases["state_dict_s"] = time.perf_counter() - t0
        if not sync and dcp_state:
            t = time.perf_counter()
            texts = self._side_texts(state, rank, world, later=True)
            phases["side_texts_s"] = time.perf_counter() - t
            return self._save_async(state, holder, texts, final, staging, t0, phases)
        t = time.perf_counter()
        plan, changed = (
            self._plans.planner(holder, rank, same=self._state_dicts.reused)
            if dcp_state
            else (None, False)
        )
        phases["planning_s"] = time.perf_counter() - t
        t = time.perf_counter()
        prepared = attempt(self._prepare, final, staging) if rank == 0 else None
        (replan,) = self._agree(prepared, state.step, changed)
        phases["prepare_s"] = time.perf_counter() - t

        texts = self._side_texts(state, rank, world)
        side = SyncedFiles(staging)
        error = attempt(self._write_texts, side, texts)
        entries: dict[str, dict[str, Any]] | None = None
        writer = None
        results = None
        if not dcp_state:
            error = (
                attempt(
                    state.model.save_checkpoint,
                    str(self.dir),
                    tag=staging.name,
                    client_state={},
                    save_latest=False,
                )
                or error
            )
        else:
            writer = HashingWriter(staging)
            # every rank writes its weights even when its side files failed (the collectives)
            failed, results = self._write_weights(writer, holder, plan, replan, phases)
            error = failed or error
            entries = writer.entries
        if entries is not None:
            entries = {**side.entries, **entries}
        self._finish(
            staging,
            final,
            state.step,
            world,
            rank,
            entries,
            error,
            phases,
            None,
            side,
            writer,
            results,
        )
        self._last_step, self._last_time = state.step, time.monotonic()
        took = time.perf_counter() - t0
        self.timings.append(
            {
                "step": state.step,
                "async": False,
                "blocked_s": took,
                "total_s": took,
                "phases": phases,
            }
        )
        return final
