"""The steps of a save that sync and async saves share: preparing the staging folder (rank 0), the
side files, this rank's weights through DCP; and the records they pass on (Target, Written)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Required, TypedDict

from torch.distributed import ProcessGroup
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlanner
from torch.distributed.checkpoint.storage import WriteResult

from hpctrain.kernel.checkpoint import CONFIG, TRAIN_STATE, old_rng_name, staging_name, step_name
from hpctrain.kernel.strategies import engine_checkpoint
from train_entry import state as st
from train_entry.checkpoint.common import attempt
from train_entry.checkpoint.statedict import PlanCache, StateDict, planner
from train_entry.checkpoint.writer import HashingWriter, SyncedFiles
from train_entry.compat import dcp_save
from train_entry.state import TrainState

# A save's side files: {relative path: text, or a function giving it when written (async saves)}.
Texts = dict[str, str | Callable[[], str]]
# One save's row of Checkpointer.timings (saves.jsonl): blocked_s is the training time it cost,
# phases its seconds per phase (docs/checkpoint-resume.md); an async save's total_s comes at wait()
Timing = TypedDict(
    "Timing",
    {
        "step": Required[int],
        "async": Required[bool],
        "blocked_s": Required[float],
        "phases": Required[dict[str, float]],
        "total_s": float,
        "hook_wait_s": float,
        "wait_blocked_s": float,
    },
    total=False,
)


@dataclass(frozen=True)
class Target:
    """One save: its step, the staging folder every rank writes into, the step-N folder rank 0
    renames it to, and who writes (this rank, of `world`)."""

    step: int
    staging: Path
    final: Path
    rank: int
    world: int

    @classmethod
    def of(cls, folder: Path, *, step: int, rank: int, world: int) -> Target:
        """The save of `step` into the checkpoints `folder`."""
        return cls(
            step=step,
            staging=folder / staging_name(step),
            final=folder / step_name(step),
            rank=rank,
            world=world,
        )


@dataclass
class Written:
    """What this rank wrote of one save: its side files, the writer of its tensors (None for an
    engine's files, or when it staged nothing), where they lie when the cached plan wrote them
    (`results`, which rank 0 puts into DCP's metadata), and its error."""

    side: SyncedFiles
    error: BaseException | None
    writer: HashingWriter | None = None
    results: list[WriteResult] | None = None

    def entries(self) -> dict[str, dict[str, object]] | None:
        """{relative path: size and checksum} of every file this rank wrote; None when its
        files were not hashed while written (the engine's: rank 0 reads them)."""
        if self.writer is None:
            return None
        return {**self.side.entries, **self.writer.entries}


def prepare(target: Target, *, log: Callable[[str], None]) -> None:
    """Rank 0: an empty staging folder, whatever an earlier save of the step left."""
    final, staging = target.final, target.staging
    final.parent.mkdir(parents=True, exist_ok=True)
    if staging.exists():
        # A save killed half way: never a checkpoint (no manifest, never renamed). Reuse the name.
        log(f"removing {staging}: an earlier save of this step did not finish")
        shutil.rmtree(staging)
    if final.exists():
        # Only reachable when that folder did not verify at load (else we would have resumed
        # from it): keep it for inspection under another name, never delete it.
        aside = final.with_name(f"{final.name}.unverified-{time.time_ns()}")
        log(f"WARNING: {final} exists but was not resumed from; moved to {aside.name}")
        os.rename(final, aside)
    # no fsync here: a staging folder lost in a crash is never a checkpoint anyway; the
    # commit's fsyncs make the finished one durable
    staging.mkdir(parents=True)


# The side texts' key of this rank's generators when its weights file carries them (its tail)
RNG_TAIL = "<rng tail>"


def side_texts(state: TrainState, *, target: Target, strategy: str, later: bool = False) -> Texts:
    """This rank's generators, and on rank 0 the loop state and config, as of now. `later`:
    the generators' states are taken now (new objects) and encoded when written (on an async
    save's thread)."""
    rng = st.capture_rng()
    # DCP saves: the tail of this rank's weights file (W + 4 files a save); an engine writes its
    # own files, so its generators keep a file per rank (the layout before issue 37)
    key = old_rng_name(target.rank) if engine_checkpoint(strategy) else RNG_TAIL
    texts: Texts = {key: (lambda: st.dumps(rng)) if later else st.dumps(rng)}
    if target.rank == 0:
        loop = state.loop_state() | {"world_size": target.world, "strategy": strategy}
        texts[TRAIN_STATE] = st.dumps(loop)
        texts[CONFIG] = json.dumps(state.config, indent=1, sort_keys=True, default=str)
    return texts


def write_texts(side: SyncedFiles, texts: Texts) -> None:
    """The side files now; the generators' text is kept as `side.tail` for the weights file."""
    for rel, text in texts.items():
        data = text() if callable(text) else text
        if rel == RNG_TAIL:
            side.tail = data.encode()
        else:
            side.write(rel, data)


def write_weights(
    writer: HashingWriter,
    *,
    sd: StateDict,
    plan: SavePlanner | None,
    replan: bool,
    plans: PlanCache,
    phases: dict[str, float],
    group: ProcessGroup | None = None,
) -> tuple[BaseException | None, list[WriteResult] | None]:
    """This rank's tensors into its raw file: with the cached plan when no rank's plan changed
    (no collectives; the offsets go to rank 0 with the checksums, returned here), else
    through dcp.save, which plans afresh and writes DCP's metadata (returned: None)."""
    t = time.perf_counter()
    results: list[WriteResult] | None = None
    if replan:
        saved: list[Metadata] = []
        error = attempt(
            lambda: saved.append(
                dcp_save({"app": sd}, storage_writer=writer, planner=planner(), process_group=group)
            )
        )
        if error is None and writer.final_plan is not None:
            plans.keep(writer.final_plan, saved[0])
        else:
            plans.clear()
    else:
        written: list[WriteResult] = []

        def write() -> None:
            # no rank's plan changed, so every rank holds a cached final plan and a planner
            assert plan is not None and plans.final is not None
            written.extend(writer.write_plan(plans.final, plan))

        error = attempt(write)
        results = written
    took = time.perf_counter() - t
    phases.update({k: v for k, v in writer.phases.items() if k in ("write_s", "hash_s")})
    phases["write_plan_s"] = writer.phases.get("write_data_s", 0.0)
    if replan:  # DCP's own planning and collectives
        phases["planning_s"] += max(0.0, took - writer.phases.get("write_data_s", 0.0))
    return error, results
