"""The Checkpointer: saves and loads TrainState atomically (the package docstring has the order of
a save; docs/checkpoint-resume.md the whole story). Every method is called by every rank at the
same point of the loop (they are collectives).

This module holds the triggers and the order of a save; its parts are objects it holds, each given
what it needs: Ranks (ranks.py, the collectives), Pruner (prune.py), Commit (commit.py, the finish
of a save on every rank and rank 0's commit), AsyncWriter (asyncsave.py, async saves), and the DCP
caches (statedict.py); steps.py has the steps sync and async saves share, load.py the load."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from torch.distributed.checkpoint.planner import SavePlanner

from hpctrain.kernel import checkpoint as fmt
from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.strategies import engine_checkpoint
from train_entry.checkpoint.asyncsave import AsyncWriter
from train_entry.checkpoint.commit import Commit
from train_entry.checkpoint.common import SaveFailed, attempt, stderr
from train_entry.checkpoint.load import load_latest
from train_entry.checkpoint.prune import Pruner
from train_entry.checkpoint.ranks import Ranks
from train_entry.checkpoint.statedict import PlanCache, StateDict, StateDicts
from train_entry.checkpoint.steps import (
    Target,
    Timing,
    Written,
    prepare,
    side_texts,
    write_texts,
    write_weights,
)
from train_entry.checkpoint.writer import HashingWriter, SyncedFiles
from train_entry.state import TrainState
from train_entry.strategies import strategy_class

STRATEGIES = strategy_names.NAMES


class Checkpointer:
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
        self._last_step: int | None = None
        # the strategy whose engine writes and reads its own files (kernel/strategies.py); None:
        # DCP saves the state
        self._engine = strategy_class(strategy) if engine_checkpoint(strategy) else None
        self._ranks = Ranks(self.dir)
        self._pruner = Pruner(self.dir, keep=keep, log=self._log)
        self._state_dicts = StateDicts()  # the last save's state dict, reused while still live
        self._plans = PlanCache()  # the last save's DCP plan, reused while unchanged
        self._commit = Commit(
            ranks=self._ranks, plans=self._plans, pruner=self._pruner, strategy=strategy
        )
        self.timings: list[Timing] = []  # per save: docs/checkpoint-resume.md
        self._async: AsyncWriter | None = None  # made by the first async save
        if self.async_save:
            self._async_writer()  # here, not in the first save's blocked time

    # ------------------------------------------------------------ save
    def maybe_save(self, state: TrainState, *, last: bool = False) -> bool:
        """Save if a trigger fires (every N steps, every T minutes agreed across ranks, or `last`)."""
        due = last or bool(self.every_steps and state.step % self.every_steps == 0)
        if not due and self.every_minutes:
            # Clocks differ per rank: any rank past the interval makes every rank save this step.
            due = self._ranks.any_rank(
                time.monotonic() - self._last_time >= self.every_minutes * 60
            )
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
        ranks = self._ranks
        target = Target.of(self.dir, step=state.step, rank=ranks.rank, world=ranks.world)
        try:
            if not sync and self._engine is None:
                self._save_async(state, target)
            else:
                self._save_sync(state, target)
        except SaveFailed:
            self._failed(target)
            raise
        return target.final

    def wait(self) -> None:
        """Block until the pending async save is written and committed (on every rank), and any
        pruned folder deleted; SaveFailed on every rank when the save failed on any."""
        t0 = time.monotonic()
        pending = self._async.wait() if self._async is not None else None
        self._pruner.join()
        if pending is None:
            return
        for row in reversed(self.timings):
            if row["step"] == pending.target.step:
                row["total_s"] = time.monotonic() - pending.started
                row["wait_blocked_s"] = time.monotonic() - t0
                row["blocked_s"] += row["wait_blocked_s"]
                break
        if pending.failed:
            self._failed(pending.target)
            self._last_step = None
            raise SaveFailed(pending.target.step, self.dir, pending.error, pending.causes)

    def _save_sync(self, state: TrainState, target: Target) -> None:
        """One save: the state dict (cached while live), the save plan (cached while unchanged),
        prepare (rank 0), this rank's files (`_write`), then the finish on every rank (Commit).
        The ranks agree on failure (and on whether to plan afresh) after the prepare and at the
        end."""
        t0 = time.perf_counter()
        phases: dict[str, float] = {}
        sd: StateDict = {}
        if self._engine is None:
            sd = self._state_dicts.get(state.model, state.optimizer, flat=state.flat_optim)
            phases["state_dict_s"] = time.perf_counter() - t0
        t = time.perf_counter()
        plan, changed = (
            self._plans.planner(sd, target.rank, same=self._state_dicts.reused)
            if self._engine is None
            else (None, False)
        )
        phases["planning_s"] = time.perf_counter() - t
        t = time.perf_counter()
        prepared = attempt(lambda: prepare(target, log=self._log)) if target.rank == 0 else None
        (replan,) = self._ranks.agree(prepared, state.step, changed)
        phases["prepare_s"] = time.perf_counter() - t
        written = self._write(state, target=target, sd=sd, plan=plan, replan=replan, phases=phases)
        self._commit.finish(target, written=written, phases=phases)
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

    def _write(
        self,
        state: TrainState,
        *,
        target: Target,
        sd: StateDict,
        plan: SavePlanner | None,
        replan: bool,
        phases: dict[str, float],
    ) -> Written:
        """This rank's files of a sync save: the side files, then the weights (DCP's through
        HashingWriter, or the engine's own). Every rank writes its weights even when its side
        files failed (the collectives)."""
        texts = side_texts(state, target=target, strategy=self.strategy)
        side = SyncedFiles(target.staging)
        error = attempt(lambda: write_texts(side, texts))
        engine = self._engine
        if engine is not None:
            error = attempt(lambda: engine.save_engine(state.model, folder=target.staging)) or error
            return Written(side, error)
        writer = HashingWriter(target.staging, tail=side.tail)
        failed, results = write_weights(
            writer, sd=sd, plan=plan, replan=replan, plans=self._plans, phases=phases
        )
        return Written(side, failed or error, writer=writer, results=results)

    def _save_async(self, state: TrainState, target: Target) -> None:
        """Blocks only for the state dict, the side texts and the copy of model buffers; the
        AsyncWriter's thread does the rest (`wait()` joins it)."""
        t0 = time.perf_counter()
        sd = self._state_dicts.get(state.model, state.optimizer, flat=state.flat_optim)
        phases = {"state_dict_s": time.perf_counter() - t0}
        t = time.perf_counter()
        texts = side_texts(state, target=target, strategy=self.strategy, later=True)
        phases["side_texts_s"] = time.perf_counter() - t
        self._async_writer().start(
            state,
            sd=sd,
            same=self._state_dicts.reused,
            target=target,
            texts=texts,
            phases=phases,
        )
        self._last_step, self._last_time = state.step, time.monotonic()
        self.timings.append(
            {
                "step": state.step,
                "async": True,
                "blocked_s": time.perf_counter() - t0,
                "phases": phases,
            }
        )

    def _async_writer(self) -> AsyncWriter:
        if self._async is None:
            self._async = AsyncWriter(
                ranks=self._ranks,
                plans=self._plans,
                commit=self._commit,
                timings=self.timings,
                log=self._log,
            )
        return self._async

    def _failed(self, target: Target) -> None:
        """After a failed save: its staging folder and `latest` temp file go (rank 0)."""
        if target.rank == 0:
            shutil.rmtree(target.staging, ignore_errors=True)  # frees the space; never a checkpoint
            fmt.latest_tmp(self.dir).unlink(missing_ok=True)
        self._last_time = time.monotonic()  # retry after another interval, not every step

    # ------------------------------------------------------------ load
    def load_latest(self, state: TrainState) -> int | None:
        """Restore `state` in place from the newest verified checkpoint; the step, or None if none."""
        step = load_latest(
            state,
            folder=self.dir,
            strategy=self.strategy,
            engine=self._engine,
            ranks=self._ranks,
            log=self._log,
        )
        if step is not None:
            self._last_step, self._last_time = step, time.monotonic()
        return step
