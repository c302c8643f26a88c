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
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import profile

from hpctrain.kernel import layout
from hpctrain.kernel.checkpoint import LATEST, step_folders
from hpctrain.kernel.rundir import RunFolder
from hpctrain.kernel.strategies import engine_checkpoint
from hpctrain.kernel.support import TORCH
from hpctrain.runtime import recovery
from hpctrain.runtime.recovery import Snapshots
from train_entry import perf, snapshot
from train_entry.checkpoint import roundtrip
from train_entry.checkpoint.checkpointer import Checkpointer
from train_entry.checkpoint.common import FATAL, SPACE, TRANSIENT, SaveFailed
from train_entry.config import TrainConfig
from train_entry.data import Batches, build_batches, to_device, tokens_per_sample
from train_entry.dist import DistInfo, init_distributed, teardown
from train_entry.metrics import GpuSampler, Metrics, profiler, rank_logger
from train_entry.model import build_model
from train_entry.parallel.dims import ParallelDims
from train_entry.preempt import PREEMPTED_EXIT, StopFlag
from train_entry.pretrained import load as pretrained
from train_entry.state import TrainState
from train_entry.stepsync import Boundary, StepSync
from train_entry.strategies import wrap
from train_entry.strategies.base import Strategy
from train_entry.watchdog import Watchdog, pg_timeout_min

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
        self._failed_saves = 0  # periodic saves failed in a row (_try_save)
        self._saves_recorded = 0  # how many of the checkpointer's timings saves.jsonl holds

    def run(self) -> int:
        """0 when max_steps are done, 75 when stopped by the preemption flag (after a verified save)."""
        if os.environ.get("LOCAL_RANK", "0") == "0":  # one a node, before the ranks meet
            self._check_checkpoint_path()
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

    def _check_checkpoint_path(self) -> None:
        """A tiny save + verify + load here (checkpoint/roundtrip.py): a checkpoint path that cannot
        work on this node ends the start before any step, not at the first save interval."""
        folder = (
            self.run_dir / layout.PREFLIGHT / f"round-trip-{socket.gethostname()}-{os.getpid()}"
        )
        bad = roundtrip.problem(folder)
        if bad:
            raise RunFailed(
                f"{bad} in {folder.parent} on {socket.gethostname()}, before training; fix the "
                f"cause (torch {torch.__version__} here; hpctrain supports torch {TORCH}), then "
                f"`hpctrain resume {self.run_dir.name}`"
            )

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
            self._failed_saves += 1
            fatal = e.kind == FATAL or (
                e.kind == TRANSIENT and self._failed_saves >= TRANSIENT_TRIES
            )
            if rank == 0:
                with contextlib.suppress(OSError):
                    self._event(
                        "save_failed",
                        step=e.step,
                        no_space=e.no_space,
                        kind=e.kind,
                        reason=str(e),
                        detail=e.detail,
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
        cfg, t, rank, world = self.cfg, self.cfg.train, info.rank, info.world_size
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log = rank_logger(self.run_dir, rank)
        stop = StopFlag().install()

        # ---- build: the mesh, the model (same init on every rank), this rank's data, the strategy
        dims, w, batches, n_params = self._build(info)
        state = TrainState(
            model=w.model,
            optimizer=w.optimizer,
            scheduler=w.checkpointed_scheduler,
            scaler=w.scaler,
            config=cfg.model_dump(mode="json"),
            flat_optim=dims.mesh is not None,  # pp ranks hold different parameters
        )
        metrics = self._metrics(info, state.config, device=w.device, n_params=n_params)
        ckpt = self._checkpointer(log=metrics.line)

        # ---- resume from the newest verified checkpoint, if any (no flag: a restart just continues)
        snaps = self._resume(state, batches, ckpt=ckpt, metrics=metrics, device=w.device)
        metrics.start(state.step)
        start = self._start_line(info, dims, device=w.device, n_params=n_params, step=state.step)
        self._say(start, metrics, log)
        if rank == 0:
            self._write_mesh(dims)
        with contextlib.ExitStack() as closing:  # closed whatever happens, in reverse order
            beat, prof = self._observers(closing, info, metrics, w.device)

            # ---- the loop: one optimizer step per iteration
            sync = StepSync(w.device, rank=rank, world_size=world)
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
                    self._log(metrics, before, world)
                saved = self._try_save(
                    lambda: ckpt.maybe_save(state), rank=rank, metrics=metrics, log=log
                )
                if saved:
                    self._record_saves(ckpt, rank)
                if snaps is not None:
                    snaps.step(state.step, saved=saved)
                beat.beat(state.step)

                # preemption: every rank read the same votes, so all stop at the same step
                stopping = (
                    stop.reached(state.step)
                    or (before is not None and before.votes > 0)
                    or (world == 1 and here.vote)
                )
                if not stopping and state.step < t.max_steps:
                    sync.launch(here)
                    continue
                # a stop or the last step: this step's metrics line now, before the checkpoint
                self._log(metrics, sync.now(here), world)
                if not stopping or state.step >= t.max_steps:
                    break  # a stop asked at the last step finds the training complete: exit 0
                stop.raise_("another rank")  # keeps this rank's own reason when it has one
                if not saved:
                    ckpt.save(state, sync=True)
                self._wait_saves(ckpt, rank)
                why = f"stopped at step {state.step} ({stop.reason}): checkpoint saved, exit 75"
                self._say(why, metrics, log)
                if rank == 0:
                    self._event("preempted", step=state.step, reason=stop.reason)
                if snaps is not None:
                    snaps.close()
                return PREEMPTED_EXIT

            # ---- the end: last checkpoint, wait for async saves, the final params hash
            ckpt.maybe_save(state, last=True)
            self._wait_saves(ckpt, rank)
            digest = w.params_sha256()  # a collective for FSDP2 / ZeRO-3
            if rank == 0:
                RunFolder(self.run_dir).write(layout.FINAL_PARAMS, digest + "\n")
            if snaps is not None:
                snaps.close()
            done = f"done: {state.step} steps, final params sha256 {digest[:16]}..."
            self._say(done, metrics, log)
            return 0

    # ---- the parts of _train, in its order
    def _build(self, info: DistInfo) -> tuple[ParallelDims, Strategy, Batches, int]:
        """tp/pp: the device mesh; its tp and pp peers read the same data shard (dims.dp_rank).
        Returns the mesh, the strategy, this rank's batches and the model's parameter count."""
        cfg, rank, world = self.cfg, info.rank, info.world_size
        dims = ParallelDims.build(cfg, rank=rank, world_size=world, device=info.device)
        model = build_model(cfg, rank=rank, world_size=world)
        n_params = sum(p.numel() for p in model.parameters())
        reader = dims.tp_rank == dims.pp_rank == 0  # one rank per data shard records its ids
        run_dir = self.run_dir if reader else None
        batches = build_batches(cfg, rank=dims.dp_rank, world_size=dims.dp, run_dir=run_dir)
        # an hf: model (on the meta device) loads each rank's share once the layout is applied
        load = pretrained.Loader.of(model, cfg, dims, device=info.device)
        w = wrap(model, cfg=cfg, device=info.device, grad_accum=self.accum, dims=dims)
        if load is not None:
            load()
        return dims, w, batches, n_params

    def _metrics(
        self, info: DistInfo, config: dict[str, object], *, device: torch.device, n_params: int
    ) -> Metrics:
        t = self.cfg.train
        metrics = Metrics(
            self.run_dir,
            rank=info.rank,
            max_steps=t.max_steps,
            log_every=t.log_every,
            tensorboard=t.tensorboard,
            tracker=t.tracker,
            tracker_project=t.tracker_project,
            config=config,
        )
        peak = perf.peak_flops(device, t.precision)
        if peak is not None:
            metrics.flops_per_token = perf.flops_per_token(n_params, self.cfg)
            metrics.peak_flops = peak * info.world_size
        return metrics

    def _checkpointer(self, *, log: Callable[[str], None]) -> Checkpointer:
        c = self.cfg.checkpoint
        return Checkpointer(
            self.run_dir,
            strategy=self.cfg.strategy,
            every_steps=c.every_steps,
            every_minutes=c.every_minutes,
            keep=c.keep,
            async_save=c.async_save,
            log=log,
        )

    def _resume(
        self,
        state: TrainState,
        batches: Batches,
        *,
        ckpt: Checkpointer,
        metrics: Metrics,
        device: torch.device,
    ) -> Snapshots | None:
        """Load the newest state into `state` and `batches`; the in-memory snapshots, if on. An
        in-job restart (preemption.max_in_job_restarts) resumes from the newest snapshot when it
        is newer than the newest disk checkpoint (hpctrain/runtime/recovery.py)."""
        restarted = recovery.agreed_restart(device)
        snaps = self._snapshots(state, metrics.line)
        disk = step_folders(ckpt.dir)
        newest = disk[0][0] if disk else -1
        if restarted and snaps is not None and snaps.restore(newest) is not None:
            batches.restore(state.data)
        elif ckpt.load_latest(state) is not None:
            batches.restore(state.data)
        if restarted and metrics.main:  # rank 0: one event per restart
            with contextlib.suppress(OSError):
                recovery.record(self.run_dir, resumed=state.step, source="train_entry")
        return snaps

    def _snapshots(self, state: TrainState, log: Callable[[str], None]) -> Snapshots | None:
        """In-memory snapshots for in-job restarts (snapshot.every_steps); DeepSpeed's engine
        saves its own state, so its restarts load the disk checkpoint."""
        every = self.cfg.snapshot.every_steps
        if not snapshot.enabled(every) or engine_checkpoint(self.cfg.strategy):
            return None
        payload, apply = snapshot.for_train_state(state, flat=state.flat_optim)
        return Snapshots(
            self.run_dir,
            every=every,
            budget=self.cfg.snapshot.budget,
            payload=payload,
            apply=apply,
            log=log,
        )

    def _start_line(
        self, info: DistInfo, dims: ParallelDims, *, device: torch.device, n_params: int, step: int
    ) -> str:
        t, world = self.cfg.train, info.world_size
        ranks = f"{world} rank{'s' if world != 1 else ''}"
        shards = ranks if dims.mesh is None else f"dp {dims.dp}"
        if dims.mesh is not None:
            ranks = f"{ranks} on a mesh of {dims.describe()}"
        return (
            f"{self.cfg.strategy}: {ranks} ({info.backend}/{device.type}), {n_params:,} "
            f"params, global batch {t.global_batch} = {shards} x micro "
            f"{t.micro_batch} x accum {self.accum}, step {step}/{t.max_steps}"
        )

    def _observers(
        self, closing: contextlib.ExitStack, info: DistInfo, metrics: Metrics, device: torch.device
    ) -> tuple[Watchdog, profile | None]:
        """The stall heartbeat (watchdog.stall_s), the GPU sampler, the profiler: closed by
        `closing`, after the metrics."""
        closing.callback(metrics.close)
        beat = Watchdog(self.run_dir, info.rank).start()
        closing.callback(beat.stop)
        if info.local_rank == 0 and GpuSampler.available(device):
            closing.callback(GpuSampler(self.run_dir / "gpu.csv").start().stop)
        prof = closing.enter_context(
            profiler(self.run_dir, info.rank, **self.cfg.profile.model_dump())
        )
        return beat, prof

    @staticmethod
    def _say(line: str, metrics: Metrics, log: logging.Logger) -> None:
        metrics.line(line)
        log.info(line)

    def _log(self, metrics: Metrics, b: Boundary, world: int) -> None:
        """The metrics line of a reduced boundary: the loss averaged over micro-steps and ranks."""
        if b.log:
            metrics.step(
                b.step,
                loss=b.loss / (self.accum * world),
                lr=b.lr,
                samples=self.cfg.train.global_batch,
                grad_norm=b.grad_norm,
                memory=b.memory,
                perf=b.perf,
                wall=b.wall,
            )

    def _write_mesh(self, dims: ParallelDims) -> None:
        """mesh.json: this start's layout, for `status` and `report` (rewritten at every start,
        since a resume may change it)."""
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

    def _wait_saves(self, ckpt: Checkpointer, rank: int) -> None:
        """Wait for the async saves, then record them."""
        ckpt.wait()
        self._record_saves(ckpt, rank)

    def _record_saves(self, ckpt: Checkpointer, rank: int) -> None:
        """saves.jsonl: how long each save held the loop (`hpctrain report` sums it)."""
        done = self._saves_recorded
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

    def _event(self, name: str, **fields: object) -> None:
        RunFolder(self.run_dir).event(name, **fields, source="train_entry")
