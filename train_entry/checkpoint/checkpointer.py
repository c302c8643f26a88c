"""The Checkpointer: saves and loads TrainState atomically (the package docstring has the order of
a save; docs/checkpoint-resume.md the whole story). Every method is called by every rank at the
same point of the loop (they are collectives).

This module holds the triggers and the sync save; its parts by job: load.py (load_latest),
asyncsave.py (async saves), prune.py (dropping old folders), ranks.py (the collectives)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.checkpoint import staging_name, step_name
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.strategies import engine_checkpoint
from train_entry.checkpoint.asyncsave import AsyncSaves, _Pending
from train_entry.checkpoint.common import (
    OtherRank,
    PlanCache,
    SaveFailed,
    StateDicts,
    attempt,
    planner,
    stderr,
)
from train_entry.checkpoint.load import Loading
from train_entry.checkpoint.prune import Pruning
from train_entry.checkpoint.ranks import RankCollectives

STRATEGIES = strategy_names.NAMES


class Checkpointer(Loading, AsyncSaves, Pruning, RankCollectives):
    """Saves and loads TrainState atomically; see the module docstring and docs/checkpoint-resume.md.

    Every method is called by every rank at the same point of the loop (they are collectives).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
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
        self._pending: _Pending | None = None
        self._async_group: Any = None
        self._stager: Any = None  # async saves: CPU copies of the state, kept between saves
        self._writer: threading.Thread | None = None  # async saves: the one writer thread
        self._hooked: Any = None  # the optimizer whose step waits for an async staging copy
        self._state_dicts = StateDicts()  # the last save's state dict, reused while still live
        self._plans = PlanCache()  # the last save's DCP plan, reused while unchanged
        self._purging: threading.Thread | None = None  # deleting pruned folders
        self.timings: list[dict] = []  # per save: step, blocked_s (training time lost), total_s,
        #                                 phases (seconds per phase; docs/checkpoint-resume.md)
        if self.async_save:
            self._async_setup()  # here, not in the first save's blocked time

    # ------------------------------------------------------------ save
    def maybe_save(self, state: Any, *, last: bool = False) -> bool:
        """Save if a trigger fires (every N steps, every T minutes agreed across ranks, or `last`)."""
        due = last or bool(self.every_steps and state.step % self.every_steps == 0)
        if not due and self.every_minutes:
            # Clocks differ per rank: any rank past the interval makes every rank save this step.
            due = self._any_rank(time.monotonic() - self._last_time >= self.every_minutes * 60)
        if not due or state.step == self._last_step:
            return False
        self.save(state, sync=not self.async_save)
        return True

    def save(self, state: Any, *, sync: bool = True) -> Path:
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

    def _failed(self, staging: Path, rank: int) -> None:
        from train_entry.checkpoint.commit import latest_tmp

        if rank == 0:
            shutil.rmtree(staging, ignore_errors=True)  # frees the space; never a checkpoint
            latest_tmp(self).unlink(missing_ok=True)
        self._last_time = time.monotonic()  # retry after another interval, not every step

    def _save(self, state: Any, *, sync: bool) -> Path:
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
        holder: dict = {}
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
        entries: dict[str, dict] | None = None
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

    def _write_weights(
        self,
        writer: Any,
        sd: dict,
        plan: Any,
        replan: bool,
        phases: dict,
        group: Any = None,
    ) -> tuple[BaseException | None, list | None]:
        """This rank's tensors into its raw file: with the cached plan when no rank's plan changed
        (no collectives; the offsets go to rank 0 with the checksums, returned here), else
        through dcp.save, which plans afresh and writes DCP's metadata (returned: None)."""
        import torch.distributed.checkpoint as dcp

        box: dict[str, Any] = {}
        t = time.perf_counter()
        if replan:
            error = attempt(
                lambda: box.update(
                    md=dcp.save(
                        {"app": sd}, storage_writer=writer, planner=planner(), process_group=group
                    )
                )
            )
            if error is None and writer.final_plan is not None:
                self._plans.keep(writer.final_plan, box["md"])
            else:
                self._plans.clear()
            results = None
        else:
            error = attempt(lambda: box.update(res=writer.write_plan(self._plans.final, plan)))
            results = box.get("res", [])
        took = time.perf_counter() - t
        phases.update({k: v for k, v in writer.phases.items() if k in ("write_s", "hash_s")})
        phases["write_plan_s"] = writer.phases.get("write_data_s", 0.0)
        if replan:  # DCP's own planning and collectives
            phases["planning_s"] += max(0.0, took - writer.phases.get("write_data_s", 0.0))
        return error, results

    def _finish(
        self,
        staging: Path,
        final: Path,
        step: int,
        world: int,
        rank: int,
        entries: dict | None,
        error: BaseException | None,
        phases: dict,
        group: Any = None,
        side: Any = None,
        writer: Any = None,
        results: list | None = None,
    ) -> None:
        """Every rank's checksums (and, with a cached plan, where its tensors lie) and failure go
        to rank 0, which writes DCP's metadata if DCP did not and the manifest, while each rank's
        own fsyncs finish; once all ranks agree their files are durable, rank 0 publishes the
        checkpoint; then all agree on the outcome (on `group` for an async save, whose thread
        raises; the sync save raises SaveFailed on every rank)."""
        from train_entry.checkpoint.commit import publish, write_manifest

        t = time.perf_counter()
        gathered = self._gather((entries, error is not None, results), group)
        phases["gather_s"] = time.perf_counter() - t
        t = time.perf_counter()
        if rank == 0:
            if any(failed for _, failed, _ in gathered):
                error = error or OtherRank("another rank failed")
            else:
                files: dict[str, dict] | None = {}
                for e, _, _ in gathered:
                    files = None if e is None or files is None else {**files, **e}
                if results is not None and files is not None:
                    error = attempt(
                        writer.finish, self._plans.metadata, [r for _, _, r in gathered]
                    )
                    files.update(writer.entries)
                if error is None:
                    error = attempt(write_manifest, self, staging, final, step, world, files)
            phases["manifest_s"] = time.perf_counter() - t
        t = time.perf_counter()
        if side is not None:
            error = attempt(side.wait) or error
        if writer is not None:
            error = attempt(writer.durable) or error
            phases.update(
                {k: v for k, v in writer.phases.items() if k in ("fsync_s", "fsync_wait_s")}
            )
        phases["durable_wait_s"] = time.perf_counter() - t
        # every file of the folder is durable on every rank before rank 0 renames it
        self._agree_on(error, step, group)
        if rank == 0:
            t = time.perf_counter()
            error = attempt(publish, self, staging, final, step)
            phases["commit_s"] = time.perf_counter() - t + phases.get("manifest_s", 0.0)
        if group is None:
            t = time.perf_counter()
            self._agree(error, step)  # nobody goes on (or exits 75) before the commit
            phases["agree_s"] = time.perf_counter() - t
        elif error is not None:
            raise error

    # ------------------------------------------------------------ the steps of a save
    def _prepare(self, final: Path, staging: Path) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if staging.exists():
            # A save killed half way: never a checkpoint (no manifest, never renamed). Reuse the name.
            self._log(f"removing {staging}: an earlier save of this step did not finish")
            shutil.rmtree(staging)
        if final.exists():
            # Only reachable when that folder did not verify at load (else we would have resumed
            # from it): keep it for inspection under another name, never delete it.
            aside = final.with_name(f"{final.name}.unverified-{time.time_ns()}")
            self._warn(f"{final} exists but was not resumed from; moved to {aside.name}")
            os.rename(final, aside)
        # no fsync here: a staging folder lost in a crash is never a checkpoint anyway; the
        # commit's fsyncs make the finished one durable
        (staging / "rng").mkdir(parents=True)

    def _side_texts(self, state: Any, rank: int, world: int, later: bool = False) -> dict:
        """This rank's generators, and on rank 0 the loop state and config, as of now. `later`:
        the generators' states are taken now (new objects) and encoded when written (on an async
        save's thread)."""
        from train_entry import state as st

        rng = st.capture_rng()
        texts: dict[str, Any] = {
            f"rng/rank-{rank:05d}.json": (lambda: st.dumps(rng)) if later else st.dumps(rng)
        }
        if rank == 0:
            loop = state.loop_state() | {"world_size": world, "strategy": self.strategy}
            texts["train_state.json"] = st.dumps(loop)
            texts["config.json"] = json.dumps(state.config, indent=1, sort_keys=True, default=str)
        return texts

    @staticmethod
    def _write_texts(side: Any, texts: dict[str, Any]) -> None:
        for rel, text in texts.items():
            side.write(rel, text() if callable(text) else text)
