"""Loading the newest verified checkpoint into a TrainState (a mixin of Checkpointer)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.kernel.checkpoint import newest_verified, not_private
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.strategies import engine_checkpoint
from train_entry.checkpoint.common import AppState, is_flat
from train_entry.checkpoint.ranks import RankCollectives

if TYPE_CHECKING:  # the package imports no torch until a Checkpointer is used
    from train_entry.state import TrainState


class Loading(RankCollectives):
    """Checkpointer.load_latest and the check that a folder can load into this run."""

    def load_latest(self, state: TrainState) -> int | None:
        """Restore `state` in place from the newest verified checkpoint; the step, or None if none."""
        from train_entry import state as st

        _, rank, world = self._dist()
        choice = None
        if rank == 0:
            found = newest_verified(self.dir, warn=self._warn)
            # DeepSpeed's load_checkpoint unpickles its files fully (they hold its own classes):
            # rank 0 alone walks the folder (every rank would make it world x files lstats)
            why = (
                not_private(found[0], self.dir.parent)
                if found and engine_checkpoint(self.strategy)
                else None
            )
            choice = (str(found[0]), found[1], why) if found else None
        choice = self._broadcast(choice)
        if choice is None:
            return None
        folder, manifest, why = Path(choice[0]), choice[1], choice[2]
        self._check_compatible(folder, manifest, world)
        started = time.monotonic()
        if engine_checkpoint(self.strategy):
            if why is not None:
                from train_entry.checkpoint.safeload import unpickle_refused

                raise unpickle_refused(why)
            load_path, _ = state.model.load_checkpoint(
                str(self.dir),
                tag=folder.name,
                load_optimizer_states=True,
                load_lr_scheduler_states=True,
            )
            if load_path is None:
                raise UserError(f"DeepSpeed could not load {folder}")
        else:
            from train_entry.checkpoint.reader import RawReader
            from train_entry.checkpoint.safeload import refusals
            from train_entry.compat import dcp_load

            reader = RawReader(str(folder))
            flat = is_flat(reader.read_metadata())
            with refusals():  # a refused file is one line on every rank, not DCP's traceback
                app = AppState(state.model, state.optimizer, flat)
                dcp_load({"app": app}, storage_reader=reader)
        state.load_loop_state(st.loads((folder / "train_state.json").read_text()))
        rng_file = folder / "rng" / f"rank-{rank:05d}.json"
        if rng_file.exists():
            st.restore_rng(st.loads(rng_file.read_text()))
        else:
            self._log(
                f"rank {rank}: {folder} has no RNG state for this rank (saved with "
                f"{manifest['world_size']} ranks); its generators keep their seeded state"
            )
        self._last_step, self._last_time = state.step, time.monotonic()
        if rank == 0:
            self._log(
                f"resumed from {folder} (step {state.step}, saved by {manifest['world_size']} "
                f"ranks, loaded by {world}) in {time.monotonic() - started:.2f}s"
            )
        return state.step

    def _check_compatible(self, folder: Path, manifest: dict[str, Any], world: int) -> None:
        saved = manifest.get("strategy")
        if engine_checkpoint(saved) != engine_checkpoint(self.strategy):
            raise UserError(
                f"{folder} was saved by strategy {saved!r} and this run uses {self.strategy!r}: "
                "DDP and FSDP checkpoints load into each other, DeepSpeed ones only into DeepSpeed. "
                f"Resume with --strategy {saved}, or start a new run (another --name)."
            )
        if engine_checkpoint(saved) and manifest.get("world_size") != world:
            raise UserError(
                f"{folder} was saved by DeepSpeed with {manifest.get('world_size')} ranks and this run "
                f"has {world}: DeepSpeed checkpoints load only at the same world size. Resume with the "
                "same nodes x GPUs; or convert: ZeRO stage 3 via deepspeed.checkpoint.ds_to_universal "
                'and "checkpoint": {"load_universal": true}; any stage to plain weights via '
                "zero_to_fp32.py (weights only, the optimizer restarts). See docs/checkpoint-resume.md."
            )
