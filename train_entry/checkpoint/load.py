"""Loading the newest verified checkpoint into a TrainState (Checkpointer.load_latest), and the
check that a checkpoint can load into this run."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from torch.distributed.checkpoint.api import CheckpointException

from hpctrain.kernel.checkpoint import (
    TRAIN_STATE,
    check_manifest,
    not_private,
    read_verified,
    rng_blob,
    step_folders,
    verify_files,
)
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.strategies import engine_checkpoint
from train_entry import state as st
from train_entry.checkpoint.ranks import Ranks
from train_entry.checkpoint.reader import Damaged, RawReader
from train_entry.checkpoint.safeload import refusals, unpickle_refused
from train_entry.checkpoint.statedict import AppState, is_flat
from train_entry.compat import dcp_load
from train_entry.state import TrainState
from train_entry.strategies import strategy_class
from train_entry.strategies.base import Strategy


def load_latest(
    state: TrainState,
    *,
    folder: Path,
    strategy: str,
    engine: type[Strategy] | None,
    ranks: Ranks,
    log: Callable[[str], None],
) -> int | None:
    """Restore `state` in place from the newest verified checkpoint of `folder` (the checkpoints
    folder); the step, or None if none. `engine`: the strategy whose engine reads its own files
    (None: DCP's). Rank 0 checks the manifest (names, sizes: no file's bytes); each rank checks
    the digests of the files it reads, and the ranks agree (one all-reduce, and DCP's read
    collective for the weights, whose digests are taken as they are copied: one pass over their
    bytes): a damaged checkpoint is skipped on every rank, an older one tried (issue 37: rank 0
    alone hashing 1 TB outlived the collective timeout), which overwrites every tensor; when none
    loads after one whose tensors were partly copied, UserError (no fresh start from them)."""
    rank, world = ranks.rank, ranks.world
    below: int | None = None
    written: str | None = None  # a damaged checkpoint found as its tensors were copied
    while True:
        choice = None
        if rank == 0:
            found = _newest_checked(folder, below, log)
            # An engine's load unpickles its files fully (DeepSpeed's hold its own classes): rank
            # 0 alone walks the folder (every rank would make it world x files lstats)
            why = not_private(found[0], folder.parent) if found and engine is not None else None
            choice = (str(found[0]), found[1], why) if found else None
        choice = ranks.broadcast(choice)
        if choice is None:
            if written is not None:  # the model holds some of its bytes: no fresh start
                raise UserError(
                    f"{written}; no older checkpoint verifies, and the model already holds "
                    "some of the damaged one's tensors, so this run cannot start afresh. Move "
                    f"the damaged step-* folders out of {folder} to start from step 0."
                )
            return None
        ckpt, manifest, why = Path(choice[0]), choice[1], choice[2]
        check_compatible(ckpt, manifest, strategy=strategy, world=world)
        started = time.monotonic()
        damaged = _load(state, ckpt, manifest, engine=engine, private=why, ranks=ranks, log=log)
        if damaged is None:
            break
        if rank == 0:
            log(f"WARNING: checkpoint {ckpt} skipped: {damaged[0]}; it is left in place")
        if damaged[1]:
            written = written or f"checkpoint {ckpt} did not verify ({damaged[0]})"
        below = int(str(manifest["step"]))
    if rank == 0:
        log(
            f"resumed from {ckpt} (step {state.step}, saved by {manifest['world_size']} "
            f"ranks, loaded by {world}) in {time.monotonic() - started:.2f}s"
        )
    return state.step


def _newest_checked(
    folder: Path, below: int | None, log: Callable[[str], None]
) -> tuple[Path, dict[str, object]] | None:
    """Rank 0: the newest step folder below `below` whose manifest checks (`check_manifest`)."""
    for step, ckpt in step_folders(folder):
        if below is not None and step >= below:
            continue
        manifest, why = check_manifest(ckpt)
        if manifest is not None:
            return ckpt, manifest
        log(f"WARNING: checkpoint {ckpt} skipped: {why}; it is left in place")
    return None


def _load(
    state: TrainState,
    ckpt: Path,
    manifest: dict[str, object],
    *,
    engine: type[Strategy] | None,
    private: str | None,
    ranks: Ranks,
    log: Callable[[str], None],
) -> tuple[str, bool] | None:
    """This rank's part of `ckpt` into `state`, each file verified as it is read; None once
    loaded, else why the ranks agreed it is damaged and whether that was found as a weights file
    was copied (its tensors hold some of its bytes; nothing else of it applied)."""
    rank = ranks.rank
    reader = RawReader(str(ckpt), manifest=manifest)
    flat = False
    try:
        loop = read_verified(ckpt, manifest, TRAIN_STATE)
        rng = rng_blob(ckpt, manifest, rank)
        if engine is None:
            flat = is_flat(reader.read_metadata())
            bad = None
        else:
            bad = verify_files(ckpt, manifest, engine_reads(manifest, rank, ranks.world))
    except (ValueError, Damaged) as exc:
        bad = str(exc)
    if ranks.any_rank(bad is not None):
        whys = ranks.gather(bad)  # only on this path: the reason for rank 0's warning line
        return next((f"rank {r}: {w}" for r, w in enumerate(whys) if w), "another rank"), False
    if engine is not None:
        if private is not None:
            raise unpickle_refused(private)
        engine.load_engine(state.model, folder=ckpt)
    else:
        try:
            with refusals():  # a refused file is one line on every rank, not DCP's traceback
                app = AppState(state.model, state.optimizer, flat)
                dcp_load({"app": app}, storage_reader=reader)
        except CheckpointException as exc:  # every rank has every rank's failure
            why = _damaged(exc)
            if why is None:
                raise
            return why
    state.load_loop_state(st.loads(loop.decode()))
    if rng is not None:
        st.restore_rng(st.loads(rng.decode()))
    else:
        log(
            f"rank {rank}: {ckpt} has no RNG state for this rank (saved with "
            f"{manifest['world_size']} ranks); its generators keep their seeded state"
        )
    return None


def _damaged(exc: CheckpointException) -> tuple[str, bool] | None:
    """('rank R: why', found as it was copied) of the first rank whose files did not verify
    (DCP's planning, or the read), else None."""
    for r, failure in sorted(exc.failures.items()):
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, Damaged):
            return f"rank {r}: {inner}", inner.written
    return None


_ENGINE_RANK = re.compile(r"(?:zero_pp_rank_|rng/rank-)0*(\d+)[_.]")


def engine_reads(manifest: Mapping[str, object], rank: int, world: int) -> list[str]:
    """The files an engine's rank verifies: those of its rank (DeepSpeed's zero_pp_rank_<R>_*,
    rng/rank-<R>.json) and those every rank reads (its model states); another world size's
    rank files go to rank R % world, so each file is verified by some rank."""
    files = manifest["files"]
    assert isinstance(files, dict)
    out = []
    for rel in sorted(files):
        m = _ENGINE_RANK.search(rel)
        if m is None or int(m.group(1)) % world == rank:
            out.append(rel)
    return out


def check_compatible(
    folder: Path, manifest: Mapping[str, object], *, strategy: str, world: int
) -> None:
    """Raise UserError when the checkpoint `folder` (its `manifest`) cannot load into a run of
    `strategy` at `world` ranks: another checkpoint format, or what the strategy refuses."""
    saved = manifest.get("strategy")
    saved_name = saved if isinstance(saved, str) else None
    if engine_checkpoint(saved_name) != engine_checkpoint(strategy):
        raise UserError(
            f"{folder} was saved by strategy {saved!r} and this run uses {strategy!r}: "
            "DDP and FSDP checkpoints load into each other, DeepSpeed ones only into DeepSpeed. "
            f"Resume with --strategy {saved}, or start a new run (another --name)."
        )
    strategy_class(strategy).check_resume(
        folder, saved_world=manifest.get("world_size"), world=world
    )
