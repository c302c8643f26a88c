"""Atomic, verified checkpoints for DDP, FSDP2 (torch.distributed.checkpoint) and DeepSpeed (its engine).

One save, whatever the strategy:
  1. every rank writes into checkpoints/.staging-step-<N>/: the weights and optimizer (DCP shards, or
     the DeepSpeed engine's files), rng/rank-<R>.json (this rank's generators), and rank 0 writes
     train_state.json (step, epoch, micro-step, data position, scheduler, scaler) and config.json;
  2. rank 0, once every rank's files are on disk: fsyncs them, writes MANIFEST.json last (every file
     with size and sha256, world size, strategy, step, torch version), renames the folder to
     checkpoints/step-<8 digits>, then replaces checkpoints/latest (temp file + rename), then prunes.
A folder named step-<N> therefore always has a manifest; a crash leaves at most a .staging-* folder.

Load: the newest step-<N> whose manifest verifies (sizes and checksums). A truncated or corrupted one
is reported (one warning line naming it and why) and skipped; nothing is deleted because of it.

This module imports torch only inside the Checkpointer, so the CLI can read manifests without it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.checkpoint import (  # noqa: F401  (the format lives in the kernel; re-exported)
    FORMAT,
    LATEST,
    MANIFEST,
    STAGING_PREFIX,
    STEP_RE,
    fsync_path,
    list_files,
    newest_verified,
    sha256_file,
    staging_name,
    step_folders,
    step_name,
    step_of,
    verify,
    write_atomic,
)
from hpctrain.kernel.errors import UserError

LOW_SPACE = 64 << 20     # a save that failed with less free than this failed for lack of space
STRATEGIES = strategy_names.NAMES


class SaveFailed(Exception):
    """A checkpoint could not be written (full disk, I/O error). Raised on EVERY rank at once (the
    ranks agree on it at each step of the save), so the caller can go on training together."""

    def __init__(self, step: int, folder: Path, cause: BaseException | None) -> None:
        self.step, self.folder, self.cause = step, folder, cause
        self.no_space = getattr(cause, "errno", None) == errno.ENOSPC or "No space left" in str(cause)
        if not self.no_space:     # torch's zip writer hides ENOSPC ("unexpected pos"): ask the disk
            try:
                self.no_space = shutil.disk_usage(folder if folder.exists() else folder.parent).free < LOW_SPACE
            except OSError:
                pass
        lines = (getattr(cause, "strerror", None) or str(cause) or type(cause).__name__).strip().splitlines()
        reason = "no space left on the device" if self.no_space else (
            lines[-1][:200] if cause is not None else "another rank failed")
        super().__init__(f"checkpoint of step {step} into {folder} failed: {reason}")


def _attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> BaseException | None:
    """Run one step of a save on this rank: None, or the I/O error it raised (for _agree)."""
    try:
        fn(*args, **kwargs)
    except OSError as exc:
        return exc
    except BaseException as exc:
        # DCP wraps each rank's failure in a CheckpointException (a BaseException, on every rank)
        if type(exc).__name__ == "CheckpointException" or (
                isinstance(exc, Exception) and "No space left" in str(exc)):
            return exc
        raise
    return None


def _stderr(msg: str) -> None:
    print(f"[hpctrain checkpoint] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the checkpointer
@dataclass
class _Pending:
    """An async save in flight: its writer thread (staging copy, DCP write, rank 0's commit) and
    the event the optimizer's next step waits for (the staging copy is done)."""
    staging: Path
    step: int
    started: float
    staged: threading.Event
    thread: threading.Thread | None = None
    error: BaseException | None = None
    phases: dict = None  # type: ignore[assignment]


class _AppState:
    """DCP Stateful holder: model + optimizer through get/set_state_dict (FQNs without wrappers)."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, sd: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self.optimizer is None:
            set_model_state_dict(self.model, sd["model"])
        else:
            set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"],
                           optim_state_dict=sd["optim"])


class Checkpointer:
    """Saves and loads TrainState atomically; see the module docstring and docs/checkpoint-resume.md.

    Every method is called by every rank at the same point of the loop (they are collectives).
    """

    def __init__(self, run_dir: str | os.PathLike, *, strategy: str, every_steps: int | None = None,
                 every_minutes: float | None = None, keep: int = 2, async_save: bool = False,
                 log: Callable[[str], None] | None = None) -> None:
        if strategy not in STRATEGIES:
            raise UserError(f"checkpoint: unknown strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
        if keep < 2:
            raise UserError(f"checkpoint.keep is {keep}: keep at least 2 (the newest may be half "
                            "written when the job is killed); set checkpoint.keep: 2")
        self.dir = Path(run_dir).resolve() / "checkpoints"
        self.strategy = strategy
        self.every_steps = every_steps or None
        self.every_minutes = every_minutes or None
        self.keep = keep
        self.async_save = bool(async_save) and strategy_names.info(strategy).async_save
        self._log = log or _stderr
        self._last_time = time.monotonic()
        self._last_step: int | None = None
        self._pending: _Pending | None = None
        self._async_group: Any = None
        self._stager: Any = None        # async saves: CPU copies of the state, kept between saves
        self._hooked: Any = None        # the optimizer whose step waits for an async staging copy
        self.timings: list[dict] = []   # per save: step, blocked_s (training time lost), total_s,
        #                                 phases (seconds: prepare, state_dict, staging, planning,
        #                                 write, hash, fsync, side_files, gather, commit)
        if self.async_save:
            self._async_setup()         # here, not in the first save's blocked time

    # ------------------------------------------------------------ helpers
    @staticmethod
    def _dist() -> tuple[Any, int, int]:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist, dist.get_rank(), dist.get_world_size()
        return None, 0, 1

    def _barrier(self) -> None:
        dist, _, _ = self._dist()
        if dist is not None:
            dist.barrier()

    def _broadcast(self, obj: Any) -> Any:
        dist, _, _ = self._dist()
        if dist is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _any_rank(self, flag: bool) -> bool:
        dist, _, _ = self._dist()
        if dist is None:
            return flag
        import torch

        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def _async_setup(self) -> None:
        dist, _, _ = self._dist()
        if dist is not None and self._async_group is None:
            # The background write runs collectives; keep them off the training group.
            self._async_group = dist.new_group(backend="gloo")
        if self._stager is None:
            from train_entry.ckpt_writer import Stager

            self._stager = Stager()

    def _warn(self, msg: str) -> None:
        if self._dist()[1] == 0:
            self._log(f"WARNING: {msg}")

    # ------------------------------------------------------------ load
    def load_latest(self, state: Any) -> int | None:
        """Restore `state` in place from the newest verified checkpoint; the step, or None if none."""
        from train_entry import state as st

        _, rank, world = self._dist()
        choice = None
        if rank == 0:
            found = newest_verified(self.dir, warn=self._warn)
            choice = (str(found[0]), found[1]) if found else None
        choice = self._broadcast(choice)
        if choice is None:
            return None
        folder, manifest = Path(choice[0]), choice[1]
        self._check_compatible(folder, manifest, world)
        started = time.monotonic()
        if self.strategy == "deepspeed":
            load_path, _ = state.model.load_checkpoint(str(self.dir), tag=folder.name,
                                                       load_optimizer_states=True,
                                                       load_lr_scheduler_states=True)
            if load_path is None:
                raise UserError(f"DeepSpeed could not load {folder}")
        else:
            import torch.distributed.checkpoint as dcp

            from train_entry.ckpt_writer import RawReader

            dcp.load({"app": _AppState(state.model, state.optimizer)},
                     storage_reader=RawReader(str(folder)))
        state.load_loop_state(st.loads((folder / "train_state.json").read_text()))
        rng_file = folder / "rng" / f"rank-{rank:05d}.json"
        if rng_file.exists():
            st.restore_rng(st.loads(rng_file.read_text()))
        else:
            self._log(f"rank {rank}: {folder} has no RNG state for this rank (saved with "
                      f"{manifest['world_size']} ranks); its generators keep their seeded state")
        self._last_step, self._last_time = state.step, time.monotonic()
        if rank == 0:
            self._log(f"resumed from {folder} (step {state.step}, saved by {manifest['world_size']} "
                      f"ranks, loaded by {world}) in {time.monotonic() - started:.2f}s")
        return state.step

    def _check_compatible(self, folder: Path, manifest: dict, world: int) -> None:
        saved = manifest.get("strategy")
        if (saved == "deepspeed") != (self.strategy == "deepspeed"):
            raise UserError(
                f"{folder} was saved by strategy {saved!r} and this run uses {self.strategy!r}: "
                "DDP and FSDP checkpoints load into each other, DeepSpeed ones only into DeepSpeed. "
                f"Resume with --strategy {saved}, or start a new run (another --name).")
        if saved == "deepspeed" and manifest.get("world_size") != world:
            raise UserError(
                f"{folder} was saved by DeepSpeed with {manifest.get('world_size')} ranks and this run "
                f"has {world}: DeepSpeed checkpoints load only at the same world size. Resume with the "
                "same nodes x GPUs; or convert: ZeRO stage 3 via deepspeed.checkpoint.ds_to_universal "
                "and \"checkpoint\": {\"load_universal\": true}; any stage to plain weights via "
                "zero_to_fp32.py (weights only, the optimizer restarts). See docs/checkpoint-resume.md.")

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
        self.wait()   # one save at a time: the previous one is committed before this starts
        _, rank, _ = self._dist()
        staging = self.dir / staging_name(state.step)
        try:
            return self._save(state, sync=sync)
        except SaveFailed:
            self._failed(staging, rank)
            raise

    def _failed(self, staging: Path, rank: int) -> None:
        if rank == 0:
            shutil.rmtree(staging, ignore_errors=True)  # frees the space it took; never a checkpoint
        self._last_time = time.monotonic()              # retry after another interval, not every step

    def _agree(self, error: BaseException | None, step: int) -> None:
        """A barrier that also agrees on failure: when any rank failed, every rank raises SaveFailed
        (a rank that raised alone would leave the others waiting in the next collective)."""
        if self._any_rank(error is not None):
            raise SaveFailed(step, self.dir, error)

    def _save(self, state: Any, *, sync: bool) -> Path:
        """One save: prepare (rank 0), side files, the weights (DCP through HashingWriter, or the
        DeepSpeed engine), every rank's file checksums gathered to rank 0, rank 0's commit. The
        ranks agree on failure after the prepare and at the end (three small collectives)."""
        from train_entry.ckpt_writer import HashingWriter, SyncedFiles

        _, rank, world = self._dist()
        t0 = time.perf_counter()
        name = step_name(state.step)
        final, staging = self.dir / name, self.dir / staging_name(state.step)
        phases: dict[str, float] = {}
        if not sync and self.strategy != "deepspeed":
            texts = self._side_texts(state, rank, world)
            t = time.perf_counter()
            holder = _AppState(state.model, state.optimizer).state_dict()
            phases["state_dict_s"] = time.perf_counter() - t
            return self._save_async(state, holder, texts, final, staging, t0, phases)
        self._agree(_attempt(self._prepare, final, staging) if rank == 0 else None, state.step)
        phases["prepare_s"] = time.perf_counter() - t0

        t = time.perf_counter()
        texts = self._side_texts(state, rank, world)
        if self.strategy != "deepspeed":
            holder = _AppState(state.model, state.optimizer).state_dict()
            phases["state_dict_s"] = time.perf_counter() - t
        side = SyncedFiles(staging)
        error = _attempt(self._write_texts, side, texts)
        entries: dict[str, dict] | None = None
        if self.strategy == "deepspeed":
            error = _attempt(state.model.save_checkpoint, str(self.dir), tag=staging.name,
                             client_state={}, save_latest=False) or error
        else:
            import torch.distributed.checkpoint as dcp

            writer = HashingWriter(staging)
            t = time.perf_counter()
            # every rank enters the collective save even when its side files failed
            error = _attempt(dcp.save, {"app": holder}, storage_writer=writer,
                             planner=_planner()) or error
            dcp_s = time.perf_counter() - t
            phases.update({k: v for k, v in writer.phases.items()
                           if k in ("write_s", "hash_s", "fsync_s")})
            phases["planning_s"] = max(0.0, dcp_s - writer.phases.get("write_data_s", 0.0))
            entries = writer.entries
        t = time.perf_counter()
        error = _attempt(side.wait) or error
        phases["side_files_s"] = time.perf_counter() - t
        if entries is not None:
            entries = {**side.entries, **entries}
        self._finish(staging, final, state.step, world, rank, entries, error, phases)
        self._last_step, self._last_time = state.step, time.monotonic()
        took = time.perf_counter() - t0
        self.timings.append({"step": state.step, "async": False, "blocked_s": took, "total_s": took,
                             "phases": phases})
        return final

    def _finish(self, staging: Path, final: Path, step: int, world: int, rank: int,
                entries: dict | None, error: BaseException | None, phases: dict,
                group: Any = None) -> None:
        """Every rank's checksums and failure to rank 0; rank 0 commits unless a rank failed;
        then all agree (on `group` for an async save, whose agreement comes in wait())."""
        t = time.perf_counter()
        gathered = self._gather((entries, error is not None), group)
        phases["gather_s"] = time.perf_counter() - t
        if rank == 0:
            t = time.perf_counter()
            if any(failed for _, failed in gathered):
                error = error or RuntimeError("another rank failed")
            else:
                files: dict[str, dict] | None = {}
                for e, _ in gathered:
                    files = None if e is None or files is None else {**files, **e}
                error = _attempt(self._commit, staging, final, step, world, files)
            phases["commit_s"] = time.perf_counter() - t
        if group is None:
            self._agree(error, step)   # nobody goes on (or exits 75) before the commit
        elif error is not None:
            raise error

    def _gather(self, obj: Any, group: Any = None) -> list[Any]:
        dist, rank, world = self._dist()
        if dist is None:
            return [obj]
        out: list[Any] | None = [None] * world if rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=group)
        return out or []

    def _save_async(self, state: Any, holder: dict, texts: dict[str, str], final: Path,
                    staging: Path, t0: float, phases: dict) -> Path:
        """Return as soon as the model buffers are copied; parameters and optimizer state are
        copied by the writer thread before the optimizer's next step (which waits for it)."""
        _, rank, world = self._dist()
        self._async_setup()
        t = time.perf_counter()
        self._stager.begin(holder, _deferrable(state.model, state.optimizer))
        phases["staging_now_s"] = time.perf_counter() - t
        pending = _Pending(staging, state.step, time.monotonic(), threading.Event(), phases=phases)
        self._hook(state.optimizer)
        pending.thread = threading.Thread(target=self._write_async, daemon=True,
                                          args=(pending, texts, final, rank, world),
                                          name=f"hpctrain-save-{final.name}")
        self._pending = pending
        pending.thread.start()
        self._last_step, self._last_time = state.step, time.monotonic()
        self.timings.append({"step": state.step, "async": True,
                             "blocked_s": time.perf_counter() - t0, "phases": phases})
        return final

    def _write_async(self, p: _Pending, texts: dict[str, str], final: Path, rank: int,
                     world: int) -> None:
        """The writer thread of an async save (collectives on the save's own gloo group)."""
        from train_entry.ckpt_writer import HashingWriter, SyncedFiles

        import torch.distributed.checkpoint as dcp

        error: BaseException | None = None
        staged = None
        t = time.perf_counter()
        try:
            staged = self._stager.finish()
        except BaseException as exc:  # noqa: BLE001 - reported by wait()
            error = exc
        finally:
            p.phases["staging_s"] = time.perf_counter() - t
            p.staged.set()
        try:
            t = time.perf_counter()
            prepared = _attempt(self._prepare, final, p.staging) if rank == 0 else None
            if self._any_rank_on(self._async_group, prepared is not None):
                raise prepared or RuntimeError("rank 0 could not prepare the staging folder")
            p.phases["prepare_s"] = time.perf_counter() - t
            side = SyncedFiles(p.staging)
            error = _attempt(self._write_texts, side, texts) or error
            if self._any_rank_on(self._async_group, staged is None):
                error = error or RuntimeError("another rank could not stage its state")
                entries = None
            else:
                writer = HashingWriter(p.staging)
                t = time.perf_counter()
                error = _attempt(dcp.save, {"app": staged}, storage_writer=writer,
                                 planner=_planner(), process_group=self._async_group) or error
                p.phases["planning_s"] = max(0.0, time.perf_counter() - t
                                             - writer.phases.get("write_data_s", 0.0))
                p.phases.update({k: v for k, v in writer.phases.items()
                                 if k in ("write_s", "hash_s", "fsync_s")})
                entries = writer.entries
            error = _attempt(side.wait) or error
            if entries is not None:
                entries = {**side.entries, **entries}
            self._finish(p.staging, final, p.step, world, rank, entries, error, p.phases,
                         group=self._async_group)
        except BaseException as exc:  # noqa: BLE001 - reported by wait() on the main thread
            p.error = exc

    def _any_rank_on(self, group: Any, flag: bool) -> bool:
        dist, _, _ = self._dist()
        if dist is None:
            return flag
        import torch

        t = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return bool(t.item())

    def _hook(self, optimizer: Any) -> None:
        """The optimizer's step waits until an async save has copied what the step changes."""
        if optimizer is None or self._hooked is optimizer:
            return

        def wait_for_staging(*_: Any) -> None:
            p = self._pending
            if p is not None and not p.staged.is_set():
                t = time.perf_counter()
                p.staged.wait()
                waited = time.perf_counter() - t
                for row in reversed(self.timings):
                    if row["step"] == p.step:
                        row["hook_wait_s"] = row.get("hook_wait_s", 0.0) + waited
                        row["blocked_s"] += waited
                        break

        optimizer.register_step_pre_hook(wait_for_staging)
        self._hooked = optimizer

    def wait(self) -> None:
        """Block until the pending async save is written and committed (on every rank); SaveFailed
        on every rank when it could not be."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        t0 = time.monotonic()
        pending.staged.wait()
        if pending.thread is not None:
            pending.thread.join()
        error = pending.error
        for row in reversed(self.timings):
            if row["step"] == pending.step:
                row["total_s"] = time.monotonic() - pending.started
                row["wait_blocked_s"] = time.monotonic() - t0
                row["blocked_s"] += row["wait_blocked_s"]
                break
        try:
            self._agree(error, pending.step)
        except SaveFailed:
            self._failed(pending.staging, self._dist()[1])
            self._last_step = None
            raise

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

    def _side_texts(self, state: Any, rank: int, world: int) -> dict[str, str]:
        """This rank's generators, and on rank 0 the loop state and config, as of now."""
        from train_entry import state as st

        texts = {f"rng/rank-{rank:05d}.json": st.dumps(st.capture_rng())}
        if rank == 0:
            loop = state.loop_state() | {"world_size": world, "strategy": self.strategy}
            texts["train_state.json"] = st.dumps(loop)
            texts["config.json"] = json.dumps(state.config, indent=1, sort_keys=True, default=str)
        return texts

    @staticmethod
    def _write_texts(side: Any, texts: dict[str, str]) -> None:
        for rel, text in texts.items():
            side.write(rel, text)

    def _commit(self, staging: Path, final: Path, step: int, world: int,
                files: dict[str, dict] | None = None) -> None:
        """Rank 0: the manifest from every rank's checksums (taken while writing; files nobody
        hashed, e.g. DeepSpeed's, are read, hashed and fsynced here), the manifest and the folders
        fsynced in parallel, rename, fsync the checkpoints folder, move `latest`, prune."""
        import torch

        from train_entry.ckpt_writer import fsync_path as sync_one
        from train_entry.ckpt_writer import write_bytes_synced

        files = dict(files or {})
        unsynced = [r for r, e in files.items() if e.pop("unsynced", False)]
        rels = list_files(staging)
        extra = [r for r in rels if r not in files]
        missing = sorted(set(files) - set(rels))
        if missing:
            raise OSError(f"{staging}: {missing[0]} was written but is not there")

        def synced_entry(rel: str) -> dict:
            path = staging / rel
            sync_one(path)
            return {"size": path.stat().st_size, "sha256": sha256_file(path)}

        workers = max(2, min(8, len(extra) + len(unsynced) + 3))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            files.update(zip(extra, pool.map(synced_entry, extra)))
            manifest = {"format": FORMAT, "step": step, "strategy": self.strategy,
                        "world_size": world, "torch": torch.__version__,
                        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        "files": dict(sorted(files.items()))}
            blob = json.dumps(manifest, indent=1, sort_keys=True).encode()
            fd = os.open(staging / MANIFEST, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, blob)
                dirs = {staging / Path(r).parent for r in rels} | {staging}
                latest_tmp = self.dir / f".{LATEST}.tmp-{os.getpid()}"
                jobs = [pool.submit(os.fsync, fd), *(pool.submit(sync_one, d) for d in dirs),
                        *(pool.submit(sync_one, staging / r) for r in unsynced),
                        pool.submit(write_bytes_synced, latest_tmp, (final.name + "\n").encode())]
                for j in jobs:
                    j.result()
            finally:
                os.close(fd)
        os.rename(staging, final)
        sync_one(self.dir)              # the checkpoint is durable from here
        os.replace(latest_tmp, self.dir / LATEST)
        sync_one(self.dir)
        self._prune(step)

    def _prune(self, newest: int) -> None:
        """Drop the oldest step folders beyond `keep`, only after a newer one was committed."""
        for staging in self.dir.glob(STAGING_PREFIX + "step-*"):
            # Left by a save that was killed; older than a committed checkpoint, it can never be
            # completed (only the process that wrote it renames it). Not a checkpoint: no manifest.
            old = step_of(staging.name)
            if old is not None and old < newest and not (staging / MANIFEST).exists():
                self._log(f"removing {staging.name}: an older save that never finished")
                shutil.rmtree(staging, ignore_errors=True)
        kept = 0
        for step, folder in step_folders(self.dir):
            if step > newest or not (folder / MANIFEST).exists():
                continue
            kept += 1
            if kept > self.keep:
                shutil.rmtree(folder)


def _deferrable(model: Any, optimizer: Any) -> set[int]:
    """Storage addresses of what only the optimizer's step changes: parameters (a DTensor's local
    shard) and optimizer state. An async save copies these on its writer thread."""
    import torch

    def ptr(t: Any) -> int:
        return getattr(t, "_local_tensor", t).data_ptr()

    out = {ptr(p) for p in model.parameters()}
    if optimizer is not None:
        for st in optimizer.state.values():
            out.update(ptr(v) for v in st.values() if isinstance(v, torch.Tensor))
    return out


def _planner() -> Any:
    """DCP's default planner, reusing the previous save's plan when the state's layout is unchanged
    (it compares the plans, so a changed model or optimizer is planned afresh)."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    return DefaultSavePlanner(enable_plan_caching=True)


# ---------------------------------------------------------------- comparing two checkpoints
def _load_weights(folder: Path) -> dict[str, Any]:
    """{"model": ..., "optimizer": ...} of a DCP or DeepSpeed checkpoint, on CPU, no process group."""
    import torch

    if (folder / ".metadata").exists():
        from train_entry.ckpt_writer import load_plain

        app = load_plain(folder)["app"]
        return {"model": app.get("model"), "optimizer": app.get("optim")}
    out: dict[str, Any] = {"model": {}, "optimizer": {}}
    for path in sorted(folder.glob("*.pt")):
        obj = torch.load(path, map_location="cpu", weights_only=False)
        if "optim" in path.name:
            out["optimizer"][path.name] = obj.get("optimizer_state_dict", obj)
        else:
            out["model"][path.name] = obj.get("module", obj)
    return out


def _same(a: Any, b: Any) -> bool:
    """Bit-exact equality of nested containers of tensors and plain values."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape
                and torch.equal(a.detach().cpu().contiguous().reshape(-1).view(torch.uint8),
                                b.detach().cpu().contiguous().reshape(-1).view(torch.uint8)))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    if type(a) is type(b) and hasattr(a, "__dict__") and type(a).__eq__ is object.__eq__:
        return _same(vars(a), vars(b))      # e.g. DeepSpeed's loss scaler object
    return bool(a == b)


def compare(a: Path, b: Path) -> dict[str, Any]:
    """Which parts of two checkpoints of the same step differ: model, optimizer, rng (rank R),
    data, loop, scheduler, scaler. Used by `hpctrain check-resume`."""
    from train_entry import state as st

    differs: list[str] = []
    wa, wb = _load_weights(a), _load_weights(b)
    for part in ("model", "optimizer"):
        if not _same(wa[part], wb[part]):
            differs.append(part)
    ranks = sorted({p.name for p in (a / "rng").glob("*.json")} | {p.name for p in (b / "rng").glob("*.json")})
    for name in ranks:
        pa, pb = a / "rng" / name, b / "rng" / name
        if not (pa.exists() and pb.exists()) or pa.read_text() != pb.read_text():
            differs.append(f"rng ({name.removesuffix('.json')})")
    la, lb = (st.loads((x / "train_state.json").read_text()) for x in (a, b))
    for key, label in (("data", "data"), ("scheduler", "scheduler"), ("scaler", "scaler")):
        if not _same(la.get(key), lb.get(key)):
            differs.append(label)
    if any(la.get(k) != lb.get(k) for k in ("step", "epoch", "micro_step")):
        differs.append("loop (step/epoch/micro_step)")
    return {"differs": differs}


if __name__ == "__main__":   # python -m train_entry.checkpoint compare A B  |  verify DIR
    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        result = compare(Path(sys.argv[2]), Path(sys.argv[3]))
        print(json.dumps(result))
        sys.exit(1 if result["differs"] else 0)
    if len(sys.argv) == 3 and sys.argv[1] == "verify":
        _, problem = verify(Path(sys.argv[2]))
        print(problem or "ok")
        sys.exit(1 if problem else 0)
    print("usage: python -m train_entry.checkpoint compare CKPT_A CKPT_B | verify CKPT", file=sys.stderr)
    sys.exit(2)
