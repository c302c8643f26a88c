"""The end of a save: every rank's checksums to rank 0, rank 0's commit, the agreement (Commit). Rank
0's commit is the kernel's commit sequence (hpctrain/kernel/checkpoint.py, which the runtime API
uses too) in two halves: `write_manifest` (the manifest from every rank's checksums, fsynced with the
folders while the ranks' own fsyncs may still run) and, once every rank says its files are durable,
`publish` (the rename that makes it a checkpoint, `latest`), then the prune."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.distributed import ProcessGroup
from torch.distributed.checkpoint.storage import WriteResult

from hpctrain.kernel import checkpoint as fmt
from hpctrain.kernel.files import utc_now
from train_entry.checkpoint.common import OtherRank, attempt
from train_entry.checkpoint.prune import Pruner
from train_entry.checkpoint.ranks import Ranks
from train_entry.checkpoint.statedict import PlanCache
from train_entry.checkpoint.steps import Target, Written
from train_entry.checkpoint.writer import io_pool

# {relative path: {"size", "sha256" or "xxh3_128", ...}} of the files of a checkpoint
Files = dict[str, dict[str, object]]


def write_manifest(target: Target, *, strategy: str, files: Files | None) -> None:
    """Rank 0: the manifest from every rank's checksums (taken while writing; files nobody
    hashed, e.g. an engine's, are read, hashed and fsynced here; all of them when `files` is
    None), fsynced in parallel with the files not yet synced, the folders and a new `latest` temp
    file."""
    fields = {
        "step": target.step,
        "strategy": strategy,
        "world_size": target.world,
        "torch": torch.__version__,
        "time": utc_now(),
    }
    fmt.write_manifest(target.staging, target.final, fields, files, pool=io_pool())


def commit(
    target: Target, *, strategy: str, files: Files | None, prune: Callable[[int], None]
) -> None:
    """Both halves and the prune, for a caller whose files are all durable already."""
    write_manifest(target, strategy=strategy, files=files)
    fmt.publish(target.staging, target.final)
    prune(target.step)


class Commit:
    """The finish of a save on every rank (`finish`); rank 0 commits it and prunes (`pruner`)."""

    def __init__(self, *, ranks: Ranks, plans: PlanCache, pruner: Pruner, strategy: str) -> None:
        self.ranks, self.plans, self.pruner, self.strategy = ranks, plans, pruner, strategy

    def finish(
        self,
        target: Target,
        *,
        written: Written,
        phases: dict[str, float],
        group: ProcessGroup | None = None,
    ) -> None:
        """Every rank's checksums (and, with a cached plan, where its tensors lie) and failure go
        to rank 0, which writes DCP's metadata if DCP did not and the manifest, while each rank's
        own fsyncs finish; once all ranks agree their files are durable, rank 0 publishes the
        checkpoint; then all agree on the outcome (on `group` for an async save, whose thread
        raises; the sync save raises SaveFailed on every rank)."""
        step, error, writer = target.step, written.error, written.writer
        t = time.perf_counter()
        gathered = self.ranks.gather((written.entries(), error is not None, written.results), group)
        phases["gather_s"] = time.perf_counter() - t
        t = time.perf_counter()
        if target.rank == 0:
            error = self._manifest(target, written=written, gathered=gathered)
            phases["manifest_s"] = time.perf_counter() - t
        t = time.perf_counter()
        error = attempt(written.side.wait) or error
        if writer is not None:
            error = attempt(writer.durable) or error
            phases.update(
                {k: v for k, v in writer.phases.items() if k in ("fsync_s", "fsync_wait_s")}
            )
        phases["durable_wait_s"] = time.perf_counter() - t
        # every file of the folder is durable on every rank before rank 0 renames it
        self.ranks.agree_on(error, step, group)
        if target.rank == 0:
            t = time.perf_counter()
            error = attempt(lambda: self._publish(target))
            phases["commit_s"] = time.perf_counter() - t + phases.get("manifest_s", 0.0)
        if group is None:
            t = time.perf_counter()
            self.ranks.agree(error, step)  # nobody goes on (or exits 75) before the commit
            phases["agree_s"] = time.perf_counter() - t
        elif error is not None:
            raise error

    def _manifest(
        self,
        target: Target,
        *,
        written: Written,
        gathered: list[tuple[Files | None, bool, list[WriteResult] | None]],
    ) -> BaseException | None:
        """Rank 0: DCP's metadata (when the cached plan wrote the tensors) and the manifest; the
        error, or another rank's failure."""
        error, writer = written.error, written.writer
        if any(failed for _, failed, _ in gathered):
            return error or OtherRank("another rank failed")
        # one pass (dict.update): a copy per rank made this quadratic, 3.8 s at 32k ranks
        merged = fmt.merge_entries(e for e, _, _ in gathered)
        files: Files | None = None if merged is None else {k: dict(v) for k, v in merged.items()}
        if written.results is not None and files is not None and writer is not None:
            metadata = self.plans.metadata
            results = [r for _, _, r in gathered if r is not None]

            def finish_metadata() -> None:
                assert metadata is not None  # kept with the cached plan (PlanCache.keep)
                writer.finish(metadata, results)

            error = attempt(finish_metadata)
            files.update(writer.entries)
        if error is None:
            error = attempt(lambda: write_manifest(target, strategy=self.strategy, files=files))
        return error

    def _publish(self, target: Target) -> None:
        """Rank 0, once every file of the folder is durable: rename, `latest`, one fsync of the
        checkpoints folder; then prune (the delete runs on a thread)."""
        fmt.publish(target.staging, target.final)
        self.pruner.prune(target.step)
