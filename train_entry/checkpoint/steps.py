"""The steps of a save that sync and async saves share (a mixin of Checkpointer): preparing the
staging folder, the side files, this rank's weights, and the finish (checksums to rank 0, the
manifest, the agreement, the commit); and cleaning up after a failed one."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train_entry.checkpoint.base import Texts
from train_entry.checkpoint.common import OtherRank, attempt, planner
from train_entry.checkpoint.prune import Pruning
from train_entry.checkpoint.ranks import RankCollectives

if TYPE_CHECKING:  # the package imports no torch until a Checkpointer is used
    from torch.distributed import ProcessGroup
    from torch.distributed.checkpoint.planner import SavePlanner
    from torch.distributed.checkpoint.storage import WriteResult

    from train_entry.checkpoint.writer import HashingWriter, SyncedFiles
    from train_entry.state import TrainState


class SaveSteps(Pruning, RankCollectives):
    """The parts of Checkpointer.save that AsyncSaves' writer thread runs too."""

    def _failed(self, staging: Path, rank: int) -> None:
        from train_entry.checkpoint.commit import latest_tmp

        if rank == 0:
            shutil.rmtree(staging, ignore_errors=True)  # frees the space; never a checkpoint
            latest_tmp(self).unlink(missing_ok=True)
        self._last_time = time.monotonic()  # retry after another interval, not every step

    def _write_weights(
        self,
        writer: HashingWriter,
        sd: dict[str, Any],  # Any: a torch state dict (tensors and plain leaves)
        plan: SavePlanner | None,
        replan: bool,
        phases: dict[str, float],
        group: ProcessGroup | None = None,
    ) -> tuple[BaseException | None, list[WriteResult] | None]:
        """This rank's tensors into its raw file: with the cached plan when no rank's plan changed
        (no collectives; the offsets go to rank 0 with the checksums, returned here), else
        through dcp.save, which plans afresh and writes DCP's metadata (returned: None)."""
        from train_entry.compat import dcp_save

        box: dict[str, Any] = {}
        t = time.perf_counter()
        if replan:
            error = attempt(
                lambda: box.update(
                    md=dcp_save(
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

            def write() -> None:
                # no rank's plan changed, so every rank holds a cached final plan and a planner
                assert plan is not None and self._plans.final is not None
                box["res"] = writer.write_plan(self._plans.final, plan)

            error = attempt(write)
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
        entries: dict[str, dict[str, Any]] | None,
        error: BaseException | None,
        phases: dict[str, float],
        group: ProcessGroup | None = None,
        side: SyncedFiles | None = None,
        writer: HashingWriter | None = None,
        results: list[WriteResult] | None = None,
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
                files: dict[str, dict[str, Any]] | None = {}
                for e, _, _ in gathered:
                    files = None if e is None or files is None else {**files, **e}
                if results is not None and files is not None and writer is not None:
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

    def _side_texts(self, state: TrainState, rank: int, world: int, later: bool = False) -> Texts:
        """This rank's generators, and on rank 0 the loop state and config, as of now. `later`:
        the generators' states are taken now (new objects) and encoded when written (on an async
        save's thread)."""
        from train_entry import state as st

        rng = st.capture_rng()
        texts: Texts = {
            f"rng/rank-{rank:05d}.json": (lambda: st.dumps(rng)) if later else st.dumps(rng)
        }
        if rank == 0:
            loop = state.loop_state() | {"world_size": world, "strategy": self.strategy}
            texts["train_state.json"] = st.dumps(loop)
            texts["config.json"] = json.dumps(state.config, indent=1, sort_keys=True, default=str)
        return texts

    @staticmethod
    def _write_texts(side: SyncedFiles, texts: Texts) -> None:
        for rel, text in texts.items():
            side.write(rel, text() if callable(text) else text)
