"""Loading the newest verified checkpoint into a TrainState (Checkpointer.load_latest), and the
check that a checkpoint can load into this run."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from hpctrain.kernel.checkpoint import newest_verified, not_private
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.strategies import engine_checkpoint
from train_entry import state as st
from train_entry.checkpoint.ranks import Ranks
from train_entry.checkpoint.reader import RawReader
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
    (None: DCP's)."""
    rank, world = ranks.rank, ranks.world
    choice = None
    if rank == 0:
        found = newest_verified(folder, warn=lambda msg: log(f"WARNING: {msg}"))
        # An engine's load unpickles its files fully (DeepSpeed's hold its own classes): rank 0
        # alone walks the folder (every rank would make it world x files lstats)
        why = not_private(found[0], folder.parent) if found and engine is not None else None
        choice = (str(found[0]), found[1], why) if found else None
    choice = ranks.broadcast(choice)
    if choice is None:
        return None
    ckpt, manifest, why = Path(choice[0]), choice[1], choice[2]
    check_compatible(ckpt, manifest, strategy=strategy, world=world)
    started = time.monotonic()
    if engine is not None:
        if why is not None:
            raise unpickle_refused(why)
        engine.load_engine(state.model, folder=ckpt)
    else:
        reader = RawReader(str(ckpt))
        flat = is_flat(reader.read_metadata())
        with refusals():  # a refused file is one line on every rank, not DCP's traceback
            app = AppState(state.model, state.optimizer, flat)
            dcp_load({"app": app}, storage_reader=reader)
    state.load_loop_state(st.loads((ckpt / "train_state.json").read_text()))
    rng_file = ckpt / "rng" / f"rank-{rank:05d}.json"
    if rng_file.exists():
        st.restore_rng(st.loads(rng_file.read_text()))
    else:
        log(
            f"rank {rank}: {ckpt} has no RNG state for this rank (saved with "
            f"{manifest['world_size']} ranks); its generators keep their seeded state"
        )
    if rank == 0:
        log(
            f"resumed from {ckpt} (step {state.step}, saved by {manifest['world_size']} "
            f"ranks, loaded by {world}) in {time.monotonic() - started:.2f}s"
        )
    return state.step


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
