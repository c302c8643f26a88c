"""The training loop, top to bottom: build -> wrap -> resume -> steps -> save -> hash.

    torchrun --standalone --nproc-per-node 2 -m train_entry --strategy ddp --run-dir runs/demo --max-steps 60
    python -m train_entry --run-dir runs/cpu1 --max-steps 20            # one process, CPU

Preemption: the stop flag (signal or the STOP file) is agreed by all ranks: each rank's vote rides in
the step's one collective (train_entry/stepsync.py), read at the next step boundary, so every rank
stops at the same step; then every rank saves that step synchronously and exits 75. A restart resumes by itself from the
newest verified checkpoint: model, optimizer, schedule, scaler, RNG and the exact data position.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hpctrain.kernel import layout
from hpctrain.kernel.checkpoint import LATEST, step_folders
from hpctrain.kernel.rundir import RunFolder
from hpctrain.kernel.strategies import engine_checkpoint
from hpctrain.runtime import recovery
from hpctrain.runtime.recovery import Snapshots
from train_entry import perf, snapshot
from train_entry.checkpoint.checkpointer import Checkpointer
from train_entry.checkpoint.common import FATAL, SPACE, TRANSIENT, SaveFailed
from train_entry.config import TrainConfig
from train_entry.data import Batches, build_batches
from train_entry.dist import DistInfo, init_distributed, teardown
from train_entry.metrics import GpuSampler, Metrics, profiler, rank_logger
from train_entry.model import build_model
from train_entry.parallel.dims import ParallelDims
from train_entry.preempt import PREEMPTED_EXIT, StopFlag
from train_entry.state import TrainState
from train_entry.stepsync import Boundary, StepSync
from train_entry.strategies import wrap
from train_entry.strategies.base import Strategy
from train_entry.watchdog import Watchdog, pg_timeout_min


def to_device(batch: object, device: torch.device) -> object:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def tokens_per_sample(batch: object) -> int | None:
    """Sequence length of the first 2-D integer tensor in a batch (for tokens/s), if there is one."""
    items = (
        batch.values()
        if isinstance(batch, dict)
        else batch
        if isinstance(batch, (list, tuple))
        else [batch]
    )
    for t in items:
        if isinstance(t, torch.Tensor) and t.dim() == 2 and not t.is_floating_point():
            return t.shape[1]
    return None


TRANSIENT_TRIES = 3  # transient I/O faults in this many saves running: it is not passing


class RunFailed(Exception):
    """The run cannot go on (a full disk): one line for the user, exit code 1. `every_rank`: all
    ranks raise it together (a failed save), so only rank 0 says it."""

    def __init__(self, line: str, *, every_rank: bool = False) -> None:
        super().__init__(line)
        self.every_rank = every_rank


class Trainer:
    def __init__(self, cfg: TrainConfig, *, run_dir: str | Path, grad_accum: int) -> None:
        self.cfg, self.run_dir, self.accum = cfg, Path(run_dir).resolve(), grad_accum

    def run(self) -> int:
        """0 when max_steps are done, 75 when stopped by the preemption flag (after a verified save)."""
        info = init_distributed(
            timeout_min=pg_timeout_min(self.cfg.train.timeout_min), seed=self.cfg.train.seed
        )
        try:
            return self._train(info)
        except SaveFailed as e:
            raise RunFailed(
                self._fatal_line(e.folder, f"could not save step {e.step}", e.kind, e.reason),
                every_rank=True,
            ) from None
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            where = Path(e.filename).parent if e.filename else self.run_dir
            raise RunFailed(self._fatal_line(where, "a write failed", SPACE, "")) from None
        finally:
            teardown()

    def _newest(self) -> str:
        try:
            return (self.run_dir / "checkpoints" / LATEST).read_text().strip() or "none"
        except OSError:
            return "none"

    def _fatal_line(self, folder: Path, what: str, kind: str, reason: str) -> str:
        """One line: what failed where, the newest verified checkpoint, and the fix ("free space"
        only when the disk or the quota is full)."""
        resume = f"`hpctrain resume {self.run_dir.name}`"
        if kind == SPACE:
            return (
                f"no space left in {folder}: {what}; newest verified checkpoint: "
                f"{self._newest()}; fix: free space there, then {resume}"
            )
        if kind == TRANSIENT:
            return (
                f"{reason} in {folder}: {what} (an I/O fault, in {TRANSIENT_TRIES} saves "
                f"running or at the last one); newest verified checkpoint: {self._newest()}; "
                f"fix: check that filesystem, then {resume}"
            )
        from hpctrain.kernel.support import TORCH

        return (
            f"{reason} in {folder}: {what}, and every save would fail the same way; newest "
            f"verified checkpoint: {self._newest()}; fix the cause (torch {torch.__version__} "
            f"here; hpctrain supports torch {TORCH}), then {resume}"
        )

    def _try_save(
        self, save: Callable[[], bool], *, rank: int, metrics: Metrics, log: logging.Logger
    ) -> bool:
        """A periodic save that may fail without ending the run: every rank gets the same
        SaveFailed, reports it, keeps the previous checkpoint and tries again at the next interval,
        when the failure may pass (a full disk, a transient I/O fault). One that will repeat (an
        ImportError, a TypeError, EACCES, ...; or the same transient fault TRANSIENT_TRIES times
        running) ends the run now: training on without checkpoints only loses more work."""
        try:
            saved = bool(save())
            self._failed_saves = 0
            return saved
        except SaveFailed as e:
            self._failed_saves = getattr(self, "_failed_saves", 0) + 1
            fatal = e.kind == FATAL or (
                e.kind == TRANSIENT and self._failed_saves >= TRANSIENT_TRIES
            )
            if rank == 0:
                with contextlib.suppress(OSError):
                    self._event(
                        {
                            "event": "save_failed",
                            "step": e.step,
                            "no_space": e.no_space,
                            "kind": e.kind,
                            "reason": str(e),
                            "detail": e.detail,
                        }
                    )
            if fatal:
                raise
            why = (
                f"WARNING: {e}; keeping {self._newest()} (newest verified); training goes on and "
                "the next interval saves again"
            )
            metrics.line(why)
            log.warning(why)
            return False

    def _train(self, info: DistInfo) -> int:
        cfg, t = self.cfg, self.cfg.train
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log = rank_logger(self.run_dir, info.rank)
        stop = StopFlag().install()

        # ---- build: model (same init on every rank), this rank's data stream, the strategy
        # tp/pp: the device mesh; its tp and pp peers read the same data shard (dims.dp_rank)
        dims = ParallelDims.build(
            cfg, rank=info.rank, world_size=info.world_size, device=info.device
        )
        model = build_model(cfg, rank=info.rank, world_size=info.world_size)
        n_params = sum(p.numel() for p in model.parameters())
        batches = build_batches(cfg, rank=dims.dp_rank, world_size=dims.dp)
        w = wrap(model, cfg=cfg, device=info.device, grad_accum=self.accum, dims=dims)
        device = w.device
        state = TrainState(
            model=w.model,
            optimizer=w.optimizer,
            scheduler=w.checkpointed_scheduler,
            scaler=w.scaler,
            config=cfg.model_dump(mode="json"),
            flat_optim=dims.mesh is not None,  # pp ranks hold different parameters
        )

        # ---- resume from the newest verified checkpoint, if any (no flag: a restart just continues)
        metrics = Metrics(
            self.run_dir,
            rank=info.rank,
            max_steps=t.max_steps,
            log_every=t.log_every,
            tensorboard=t.tensorboard,
            tracker=t.tracker,
            tracker_project=t.tracker_project,
            config=state.config,
        )
        ckpt = Checkpointer(
            self.run_dir,
            strategy=cfg.strategy,
            every_steps=cfg.checkpoint.every_steps,
            every_minutes=cfg.checkpoint.every_minutes,
            keep=cfg.checkpoint.keep,
            async_save=cfg.checkpoint.async_save,
            log=metrics.line,
        )
        peak = perf.peak_flops(device, t.precision)
        if peak is not None:
            metrics.flops_per_token = perf.flops_per_token(n_params, cfg)
            metrics.peak_flops = peak * info.world_size
        # an in-job restart (preemption.max_in_job_restarts) resumes from the newest in-memory
        # snapshot when it is newer than the newest disk checkpoint (hpctrain/runtime/recovery.py)
        restarted = recovery.agreed_restart(device)
        snaps = self._snapshots(state, dims, metrics.line)
        disk = step_folders(ckpt.dir)
        newest = disk[0][0] if disk else -1
        if restarted and snaps is not None and snaps.restore(newest) is not None:
            batches.restore(state.data)
        elif ckpt.load_latest(state) is not None:
            batches.restore(state.data)
        if restarted and info.rank == 0:  # one event per restart
            with contextlib.suppress(OSError):
                recovery.record(self.run_dir, resumed=state.step, source="train_entry")
        metrics.start(state.step)
        ranks = f"{info.world_size} rank{'s' if info.world_size != 1 else ''}"
        shards = ranks if dims.mesh is None else f"dp {dims.dp}"
        if dims.mesh is not None:
            ranks = f"{ranks} on a mesh of {dims.describe()}"
        start = (
            f"{cfg.strategy}: {ranks} ({info.backend}/{device.type}), {n_params:,} "
            f"params, global batch {t.global_batch} = {shards} x micro "
            f"{t.micro_batch} x accum {self.accum}, step {state.step}/{t.max_steps}"
        )
        metrics.line(start)
        log.info(start)
        if info.rank == 0:
            self._write_mesh(dims)
        with contextlib.ExitStack() as closing:  # closed whatever happens, in reverse order
            closing.callback(metrics.close)
            beat = Watchdog(self.run_dir, info.rank).start()  # stall heartbeat (watchdog.stall_s)
            closing.callback(beat.stop)
            if info.local_rank == 0 and GpuSampler.available(device):
                closing.callback(GpuSampler(self.run_dir / "gpu.csv").start().stop)
            prof = closing.enter_context(
                profiler(self.run_dir, info.rank, **cfg.profile.model_dump())
            )

            # ---- the loop: one optimizer step per iteration
            sync = StepSync(device, rank=info.rank, world_size=info.world_size)
            while state.step < t.max_steps:
                loss_sum, grad_norm = self.train_step(w, batches, metrics)
                state.step += 1
                state.epoch, state.data = batches.epoch, batches.position
                here = Boundary(
                    step=state.step,
                    loss_sum=loss_sum,
                    grad_norm=grad_norm,
                    lr=w.lr(),
                    vote=stop.vote(),
                    log=state.step % t.log_every == 0 or state.step == t.max_steps,
                )
                if prof is not None:
                    prof.step()
                # the previous step's reduction (launched one step ago): its metrics, its votes
                before = sync.collect()
                if before is not None:
                    self._log(metrics, before, t.global_batch, info.world_size)
                saved = self._try_save(
                    lambda: ckpt.maybe_save(state), rank=info.rank, metrics=metrics, log=log
                )
                if saved:
                    self._record_saves(ckpt, info.rank)
                if snaps is not None:
                    snaps.step(state.step, saved=saved)
                beat.beat(state.step)

                # preemption: every rank read the same votes, so all stop at the same step
                stopping = (
                    stop.reached(state.step)
                    or (before is not None and before.votes > 0)
                    or (info.world_size == 1 and here.vote)
                )
                if not stopping and state.step < t.max_steps:
                    sync.launch(here)
                    continue
                # a stop or the last step: this step's metrics line now, before the checkpoint
                self._log(metrics, sync.now(here), t.global_batch, info.world_size)
                if not stopping or state.step >= t.max_steps:
                    break  # a stop asked at the last step finds the training complete: exit 0
                stop.raise_("another rank")  # keeps this rank's own reason when it has one
                if not saved:
                    ckpt.save(state, sync=True)
                ckpt.wait()
                self._record_saves(ckpt, info.rank)
                why = f"stopped at step {state.step} ({stop.reason}): checkpoint saved, exit 75"
                metrics.line(why)
                log.info(why)
                if info.rank == 0:
                    self._event({"event": "preempted", "step": state.step, "reason": stop.reason})
                if snaps is not None:
                    snaps.close()
                return PREEMPTED_EXIT

            # ---- the end: last checkpoint, wait for async saves, the final params hash
            ckpt.maybe_save(state, last=True)
            ckpt.wait()
            self._record_saves(ckpt, info.rank)
            digest = w.params_sha256()  # a collective for FSDP2 / ZeRO-3
            if info.rank == 0:
                RunFolder(self.run_dir).write(layout.FINAL_PARAMS, digest + "\n")
            if snaps is not None:
                snaps.close()
            done = f"done: {state.step} steps, final params sha256 {digest[:16]}..."
            metrics.line(done)
            log.info(done)
            return 0

    def _snapshots(
        self, state: TrainState, dims: ParallelDims, log: Callable[[str], None]
    ) -> Snapshots | None:
        """In-memory snapshots for in-job restarts (snapshot.every_steps); DeepSpeed's engine
        saves its own state, so its restarts load the disk checkpoint."""
        every = self.cfg.snapshot.every_steps
        if not snapshot.enabled(every) or engine_checkpoint(self.cfg.strategy):
            return None
        payload, apply = snapshot.for_train_state(state, flat=dims.mesh is not None)
        return Snapshots(
            self.run_dir,
            every=every,
            budget=self.cfg.snapshot.budget,
            payload=payload,
            apply=apply,
            log=log,
        )

    def _log(self, metrics: Metrics, b: Boundary, samples: int, world: int) -> None:
        """The metrics line of a reduced boundary: the loss averaged over micro-steps and ranks."""
        if b.log:
            metrics.step(
                b.step,
                loss=b.loss / (self.accum * world),
                lr=b.lr,
                samples=samples,
                grad_norm=b.grad_norm,
                memory=b.memory,
                perf=b.perf,
                wall=b.wall,
            )

    def _write_mesh(self, dims: ParallelDims) -> None:
        """mesh.json: this start's layout, for `status` and `report` (rewritten at every start,
        since a resume may change it)."""
        import json

        lay, par = dims.layout, self.cfg.parallel
        record = {
            "world": lay.world,
            "dp": lay.dp,
            "tp": lay.tp,
            "pp": lay.pp,
            "mesh": lay.describe(),
            "strategy": self.cfg.strategy,
            "schedule": par.schedule if lay.pp > 1 else None,
            "microbatches": (par.microbatches or lay.pp) if lay.pp > 1 else None,
        }
        with contextlib.suppress(OSError):
            RunFolder(self.run_dir).write(layout.MESH, json.dumps(record) + "\n")

    def _record_saves(self, ckpt: Checkpointer, rank: int) -> None:
        """saves.jsonl: how long each save held the loop (`hpctrain report` sums it)."""
        done = getattr(self, "_saves_recorded", 0)
        if rank == 0 and len(ckpt.timings) > done:
            folder = RunFolder(self.run_dir)
            with contextlib.suppress(OSError):
                for rec in ckpt.timings[done:]:
                    folder.append(layout.SAVES, {**rec, "time": time.time()}, sort_keys=False)
        self._saves_recorded = len(ckpt.timings)

    def train_step(
        self, w: Strategy, batches: Batches, metrics: Metrics
    ) -> tuple[torch.Tensor, float]:
        """One optimizer step: `accum` micro-steps (gradients reduced in the last one), then the
        update. Returns this rank's summed micro-step losses and the grad norm."""
        loss_sum = torch.zeros((), device=w.device)
        for micro in range(self.accum):
            batch = to_device(next(batches), w.device)
            if metrics.tokens_per_sample is None:
                metrics.tokens_per_sample = tokens_per_sample(batch) or 0
            loss_sum += w.micro_step(batch, micro == self.accum - 1)
        return loss_sum, w.step()

    def _event(self, record: dict[str, Any]) -> None:
        fields = dict(record)
        RunFolder(self.run_dir).event(fields.pop("event"), **fields, source="train_entry")
