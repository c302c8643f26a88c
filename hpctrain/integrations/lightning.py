"""Lightning under hpctrain, with one line: `callbacks=[HpctrainCheckpoint()]`, resumed with
`trainer.fit(model, data, ckpt_path="last")`.

    from hpctrain.integrations.lightning import HpctrainCheckpoint

    trainer = L.Trainer(max_steps=..., callbacks=[HpctrainCheckpoint()])
    trainer.fit(model, data, ckpt_path="last")   # the first start finds none and starts from 0

It is Lightning's `ModelCheckpoint` (every argument of it works; `save_last=True` by default), with
the stop flag added: after each optimizer step it votes on `runtime.should_stop(wait=False)` (the
STOP file or a signal: a preemption, the time-limit warning, `hpctrain preempt`), agreed by every
rank without holding the step (an async all-reduce read one step later). On a stop, every rank
writes `last.ckpt` through `trainer.save_checkpoint` (model, optimizer, LR schedulers, the loops'
progress, callbacks, every rank's RNG state), meets at a barrier and leaves with
`runtime.PREEMPTED` (75): the batch shell requeues the job, and `ckpt_path="last"` resumes from it.

Lightning restores the data position of a mid-epoch checkpoint only for a dataloader with
`state_dict`/`load_state_dict` (e.g. torchdata's `StatefulDataLoader`); for any other loader this
callback skips the batches of the epoch already trained on (read and dropped, not trained on) and
then restores each rank's RNG state, so the resumed run reads the same batches and draws the same
random numbers as an uninterrupted one. The checkpoints go to `<run folder>/checkpoints` under
hpctrain (a folder that does not change between restarts; Lightning's default moves with the
logger's version), else to ModelCheckpoint's usual place (pass `dirpath=` to resume outside it).

Logged values (`self.log(...)`: the trainer's callback metrics) and the step's loss go to
`runtime.log_metrics` at most once a second, so `submit --wait`, `status` and `report` show
step/total, loss and speed. Outside hpctrain nothing is written but the checkpoints.
"""

from __future__ import annotations

import io
import os
import time
import warnings
from pathlib import Path
from typing import Any

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loops.fetchers import _DataFetcher
    from lightning.pytorch.utilities.exceptions import SIGTERMException
    from lightning.pytorch.utilities.types import STEP_OUTPUT
except ImportError as e:  # one clear line, not a traceback from deep inside an import
    raise ImportError(
        "hpctrain.integrations.lightning needs lightning: pip install 'hpctrain[lightning]'"
    ) from e

import torch  # loaded already: lightning imports it
import torch.distributed as dist

from hpctrain import runtime
from hpctrain.runtime.checkpoint import Rng

NOT_RESUMABLE = "You're resuming from a checkpoint that ended before the epoch ended"
RNG_KEY = "hpctrain_rng"  # every rank's RNG state, in this callback's part of the checkpoint


class HpctrainCheckpoint(ModelCheckpoint):
    """ModelCheckpoint that saves `last.ckpt` and exits 75 at a stop; forwards logged metrics.

    every_s: how often (seconds) a progress line goes to metrics.jsonl (rank 0, under hpctrain).
    The other arguments are ModelCheckpoint's.
    """

    def __init__(
        self,
        dirpath: str | Path | None = None,
        *,
        every_s: float = 1.0,
        **kwargs: Any,  # Any: ModelCheckpoint's own keyword arguments, passed on as they are
    ) -> None:
        kwargs.setdefault("save_last", True)
        under = os.environ.get(runtime.ENV_RUN_DIR)
        if dirpath is None and under:
            dirpath = Path(under) / "checkpoints"
        super().__init__(dirpath=dirpath, **kwargs)
        self.every_s = every_s
        self.stopping: int | None = None  # the step a stop was agreed at
        self._logging = bool(under)  # progress lines only under hpctrain
        self._last_line = 0.0
        self._step = -1  # the newest step written to metrics.jsonl
        self._total: int | None = None
        self._rng: Rng | None = None  # this rank's RNG state from the checkpoint resumed from

    # ------------------------------------------------------------ the stop
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        runtime.install()  # the signal handlers, in the main thread, before the first step
        # Lightning warns that a mid-epoch checkpoint with a plain loader resumes inexactly; this
        # callback puts the loader at the right batch (_patch_epoch_start)
        warnings.filterwarnings("ignore", message=NOT_RESUMABLE)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        total: int | None = trainer.max_steps
        if total is None or total < 0:
            est = trainer.estimated_stepping_batches
            total = int(est) if est != float("inf") else None
        self._total = total
        self._patch_epoch_start(trainer)
        if trainer.ckpt_path and trainer.is_global_zero:
            print(f"resuming from {trainer.ckpt_path} (step {trainer.global_step})", flush=True)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: STEP_OUTPUT,
        batch: object,
        batch_idx: int,
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if not _stepped(trainer, batch_idx):
            return  # within a gradient accumulation: no optimizer step, no boundary to stop at
        step = trainer.global_step
        # the vote started one step ago: every rank reads the same answer at the same step
        if runtime.should_stop(wait=False) and (self._total is None or step < self._total):
            self.stopping = step  # (at the last step the run is simply done)
            self._stop(trainer, outputs)
        if self._logging and time.monotonic() - self._last_line >= self.every_s:
            self._line(trainer, outputs)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        super().on_exception(trainer, pl_module, exception)
        if isinstance(exception, SIGTERMException) and self.stopping is None:
            # a SIGTERM straight to the ranks: Lightning ends fit on every rank at the same step
            # boundary with this exception (a SystemExit, exit 0: the run would count as done);
            # save there and leave with 75 instead
            self.stopping = trainer.global_step
            self._stop(trainer, None)

    def _stop(self, trainer: pl.Trainer, outputs: STEP_OUTPUT) -> None:
        step = trainer.global_step
        path = self.format_checkpoint_name({}, self.CHECKPOINT_NAME_LAST)
        if trainer.is_global_zero and os.path.islink(path):
            os.remove(path)  # save_last="link": write a file, not through the link
        self.last_model_path = path
        trainer.save_checkpoint(path, weights_only=False)  # every rank: a collective
        for logger in trainer.loggers:  # what the loggers buffer, before os._exit
            logger.save()
        # every rank has its part saved before any leaves: torchrun stops the others as soon as
        # one rank exits non-zero
        runtime.barrier()
        if self._logging:
            self._line(trainer, outputs)  # the step the run stopped at
        if trainer.is_global_zero:
            print(f"[hpctrain] stop at step {step} ({runtime.stop_reason()}): {path}", flush=True)
        runtime.exit(runtime.PREEMPTED, step=step)

    # ------------------------------------------------------------ every rank's RNG
    def state_dict(self) -> dict[str, object]:
        state = super().state_dict()
        # bytes: Lightning loads checkpoints with torch.load(weights_only=True), which refuses
        # NumPy's RNG state; every rank calls it (a collective)
        state[RNG_KEY] = _gather(runtime._to_bytes(runtime._capture_rng()))
        return state

    def load_state_dict(self, state_dict: dict[str, object]) -> None:
        rngs = state_dict.pop(RNG_KEY, None)
        super().load_state_dict(state_dict)
        world, me = _world()
        if isinstance(rngs, list) and len(rngs) == world:
            self._rng = _from_bytes(rngs[me])
            # a checkpoint at an epoch's end: the next epoch's iterator draws from this state
            runtime._restore_rng(self._rng)

    # ------------------------------------------------------------ the data position
    def _patch_epoch_start(self, trainer: pl.Trainer) -> None:
        """After Lightning's epoch loop starts on a restored mid-epoch checkpoint (it counts the
        batches already trained on as fetched, but its loader starts the epoch again), skip those
        batches in the loader and restore this rank's RNG state as it was at the save."""
        loop = trainer.fit_loop.epoch_loop
        if getattr(loop, "_hpctrain_patched", False):  # (this trainer's loop, once)
            return
        loop._hpctrain_patched = True
        original = loop.on_run_start

        def on_run_start(data_fetcher: _DataFetcher) -> None:
            before = data_fetcher.fetched
            original(data_fetcher)
            done = data_fetcher.fetched - before  # Lightning's count of this epoch's batches done
            if done > 0 and not _stateful(trainer):
                _skip(data_fetcher, done)
            if done > 0 and self._rng is not None:
                runtime._restore_rng(self._rng)  # after the iterator drew its seed
            self._rng = None

        loop.on_run_start = on_run_start  # type: ignore[method-assign]  # the loop's hook, wrapped

    # ------------------------------------------------------------ progress
    def _line(self, trainer: pl.Trainer, outputs: STEP_OUTPUT) -> None:
        """One metrics.jsonl line per step at most (`report` reads a repeated step as a restart):
        rank 0 only."""
        step = trainer.global_step
        if not trainer.is_global_zero or step <= self._step:
            return
        values: dict[str, float] = {}
        for key, value in trainer.callback_metrics.items():
            number = _number(value)
            if number is not None:
                values[key.removesuffix("_step")] = number
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if "loss" not in values and (number := _number(loss)) is not None:
            values["loss"] = number
        if trainer.lr_scheduler_configs or trainer.optimizers:
            lr = _number(trainer.optimizers[0].param_groups[0].get("lr"))
            if lr is not None:
                values.setdefault("lr", lr)
        self._step, self._last_line = step, time.monotonic()
        runtime.log_metrics(step, total=self._total, samples=_samples(trainer), **values)


def _stepped(trainer: pl.Trainer, batch_idx: int) -> bool:
    """Whether the batch that just ended also ended an optimizer step."""
    accumulate = max(1, int(trainer.accumulate_grad_batches))
    if accumulate == 1:
        return True
    last = trainer.num_training_batches
    return (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == last


def _stateful(trainer: pl.Trainer) -> bool:
    """Lightning restores these loaders' position itself (the state_dict/load_state_dict ones)."""
    loader = trainer.fit_loop._combined_loader
    flat = getattr(loader, "flattened", [])
    return bool(flat) and all(
        callable(getattr(dl, "state_dict", None)) and callable(getattr(dl, "load_state_dict", None))
        for dl in flat
    )


def _skip(fetcher: _DataFetcher, n: int) -> None:
    """Advance the fetcher's loader past n batches, keeping what it prefetched in order."""
    batches = getattr(fetcher, "batches", [])  # a prefetching fetcher's
    pre = list(batches)
    if pre:
        batches.clear()
    ahead, iterator = len(pre), fetcher.iterator
    assert iterator is not None  # the epoch loop started it
    for _ in range(max(0, n - ahead)):
        next(iterator)
    refill = pre[n:] if n < ahead else []
    while len(refill) < ahead:
        try:
            refill.append(next(iterator))
        except StopIteration:
            break
    if pre:
        batches.extend(refill)


def _gather(obj: bytes) -> list[object]:
    world, _ = _world()
    if world == 1:
        return [obj]
    out: list[object] = [None] * world
    dist.all_gather_object(out, obj)
    return out


def _from_bytes(data: bytes) -> Rng:
    rng: Rng = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    return rng


def _world() -> tuple[int, int]:
    dist = runtime._dist()
    if dist is None:
        return 1, 0
    return dist.get_world_size(), dist.get_rank()


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    numel, item = getattr(value, "numel", None), getattr(value, "item", None)
    if callable(numel) and numel() == 1 and callable(item):
        return float(item())
    return None


def _samples(trainer: pl.Trainer) -> int | None:
    """Samples per optimizer step over all ranks, when the loader says its batch size."""
    loader = trainer.fit_loop._combined_loader
    flat = getattr(loader, "flattened", [])
    size = getattr(flat[0], "batch_size", None) if flat else None
    if not isinstance(size, int):
        return None
    return size * max(1, int(trainer.accumulate_grad_batches)) * trainer.world_size
