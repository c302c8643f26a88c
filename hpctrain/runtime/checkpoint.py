"""runtime.Checkpoint: verified checkpoints on disk in train_entry's format, and snapshots in memory
for in-job restarts (hpctrain/runtime/recovery.py, shared with train_entry; docs/recovery.md).

torch is imported on first use (a script may import the runtime before torch); the snapshot side
(recovery, which imports torch at its top) when a snapshot or a load needs it.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import random
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, cast

from hpctrain.kernel import checkpoint as fmt  # the format: step names, manifest, verify, latest
from hpctrain.kernel import fatal, jobenv, layout
from hpctrain.kernel import snapshot as snapshot_store
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.files import utc_now
from hpctrain.kernel.rundir import RunFolder
from hpctrain.runtime import restarts
from hpctrain.runtime.job import (
    _barrier,
    _closers,
    _device,
    _dist,
    _saved,
    _torch,
    _warn,
    rank,
    run_dir,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch

    from hpctrain.runtime.recovery import Snapshots

STATE_FILE = "state.pt"
SAVES = layout.SAVES  # one line per save: what `hpctrain report` sums

State = Mapping[str, object] | Callable[[], Mapping[str, object]]


class Rng(TypedDict):
    """A rank's random generators (_capture_rng): what `rng/rank-<N>.pt` and a snapshot hold."""

    python: tuple[object, ...]  # random.getstate()
    torch: torch.Tensor
    numpy: NotRequired[tuple[str, npt.NDArray[np.uint32], int, int, float]]  # the script uses numpy
    cuda: NotRequired[list[torch.Tensor]]  # CUDA initialised


class Payload(TypedDict):
    """What a runtime snapshot holds (Checkpoint._payload)."""

    state: dict[str, object]
    rng: Rng
    step: int


def _load(path: Path, *, root: Path) -> object:
    """`path` loaded weights-only; the full unpickler only when nobody but this user could have
    written it (a script's state may hold its own objects, which run as code when loaded)."""
    torch = _torch()
    try:
        got: object = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # what a weights-only load refuses
        why = fmt.not_private(path.parent, root)
        if why is not None:
            raise UserError(
                f"{path} holds objects a weights-only load refuses, and {why}: refusing to load "
                "it (unpickling runs code); fix: make the run folder yours alone (chmod -R go-w), "
                "or save tensors, containers, numbers and strings only"
            ) from None
        got = torch.load(path, map_location="cpu", weights_only=False)
    return got


@dataclass
class Found:
    step: int
    state: dict[str, Any]  # Any: the script's own values, as it saved them (torch.load)
    path: Path  # the checkpoint folder, or the node folder of the snapshot that loaded
    from_memory: bool = False


class Checkpoint:
    """Atomic, verified checkpoints of any state dict, in train_entry's format, and in-memory
    snapshots for in-job restarts.

    save(step, state): rank 0 writes `state` (torch.save: tensors, optimizer state, plain data);
    every rank writes its RNG state; rank 0 then writes the manifest last, renames the staging
    folder to step-<N>, moves `latest` and keeps the newest `keep`. load(): the newest checkpoint
    whose manifest verifies (a damaged one is reported and skipped, never deleted), RNG restored;
    after an in-job restart, the newest snapshot every rank can get when it is newer than that.

    snapshot(step, state): call it at every step boundary, on every rank (cheap when none is due).
    When one is due (every `snapshot_every` steps; None: auto, as often as its cost stays under 2%
    of a step; 0: off) each rank keeps `state` and its RNG in node-local memory and sends a copy to
    its partner on another node. Off outside an hpctrain job (no job id), and for several processes
    without a process group. Snapshots never move `latest`. close(): at the run's end (after its
    last save), the snapshots' memory freed.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str] | None = None,
        *,
        keep: int = 2,
        strategy: str = "script",
        snapshot_every: int | None = None,
    ) -> None:
        if keep < 2:
            raise ValueError(f"keep={keep}: keep at least 2 (the newest may be half written)")
        if snapshot_every is not None and snapshot_every < 0:
            raise ValueError(f"snapshot_every={snapshot_every}: steps > 0, None (auto) or 0 (off)")
        self.dir = Path(folder).absolute() if folder else run_dir() / "checkpoints"
        self.keep, self.strategy = keep, strategy
        self.blocked_s: list[float] = []  # seconds each save held the loop
        self.snapshot_every = snapshot_every
        self._snaps: Snapshots | None = None
        self._made = False
        self._state: State | None = None  # what a snapshot due now holds (snapshot's argument)
        self._restored: dict[str, object] | None = None
        self._restore_rng = True
        self._step = 0  # the step of a snapshot due now
        self._last_save = -1

    # ------------------------------------------------------------ save
    def save(self, step: int, state: Mapping[str, object]) -> Path:
        torch = _torch()
        t0 = time.monotonic()
        dist = _dist()
        me, world = (dist.get_rank(), dist.get_world_size()) if dist else (0, 1)
        name = fmt.step_name(step)
        final, staging = self.dir / name, self.dir / fmt.staging_name(step)
        if me == 0:
            self.dir.mkdir(parents=True, exist_ok=True)
            if staging.exists():
                shutil.rmtree(staging)  # a save of this step killed half way: never a checkpoint
            if final.exists():  # not resumed from, so it did not verify: keep it aside
                final.rename(final.with_name(f"{name}.unverified-{time.time_ns()}"))
            (staging / "rng").mkdir(parents=True)
        _barrier(dist)
        _write(staging / "rng" / f"rank-{me:05d}.pt", _to_bytes(_capture_rng()))
        if me == 0:
            _write(staging / STATE_FILE, _to_bytes(state))
        _barrier(dist)
        if me == 0:
            self._commit(staging, final, step, world, torch.__version__)
        _barrier(dist)
        self.blocked_s.append(time.monotonic() - t0)
        _saved.append(step)
        self._last_save = step
        if me == 0:  # what `hpctrain report` sums as time lost to blocking saves
            rec = {"step": step, "blocked_s": self.blocked_s[-1], "time": time.time()}
            with contextlib.suppress(OSError, RuntimeError):
                RunFolder(run_dir()).append(SAVES, rec, sort_keys=False)
        return final

    def _commit(
        self, staging: Path, final: Path, step: int, world: int, torch_version: str
    ) -> None:
        """Rank 0, every rank's files written: the kernel's commit sequence, as train_entry's
        (the manifest with every file hashed and fsynced, rename, `latest`, rename-then-delete
        prune)."""
        fields = {
            "step": step,
            "strategy": self.strategy,
            "world_size": world,
            "torch": torch_version,
            "time": utc_now(),
        }
        fmt.write_manifest(staging, final, fields)
        fmt.publish(staging, final)
        fmt.prune(self.dir, step, self.keep, log=_warn)

    # ------------------------------------------------------------ load
    def load(self, *, restore_rng: bool = True) -> Found | None:
        """The newest verified checkpoint (state on CPU), or None when there is none yet. After an
        in-job restart: the newest snapshot in memory every rank can get, when it is newer (every
        rank agrees), else that checkpoint. A collective with torch.distributed initialised."""
        dist = _dist()
        me = dist.get_rank() if dist else rank()  # before init_process_group (Lightning): RANK
        choice = None
        if me == 0 or dist is None:  # without a process group every process looks for itself
            found = fmt.newest_verified(self.dir, warn=_warn if me == 0 else None)
            choice = str(found[0]) if found else None
        if dist is not None:
            choice = _broadcast_text(dist, choice)
        disk = Path(choice) if choice is not None else None
        restarted = _recovery().agreed_restart(_device(dist)) if dist else fatal.restarts()
        got = self._from_memory(_step_of(disk) if disk else -1, restore_rng) if restarted else None
        if got is None and disk is not None:
            state = _load(disk / STATE_FILE, root=self.dir)  # what save() wrote: the state dict
            rng = disk / "rng" / f"rank-{me:05d}.pt"
            if restore_rng and rng.exists():
                _restore_rng(cast(Rng, _load(rng, root=self.dir)))  # what save() wrote
            got = Found(_step_of(disk), cast("dict[str, object]", state), disk)
            if me == 0:
                _warn(f"resuming from {disk} (step {got.step})")
        if restarted and me == 0 and jobenv.get(jobenv.JOB_ID):  # one event per in-job restart
            with contextlib.suppress(OSError, RuntimeError):
                restarts.record(run_dir(), resumed=got.step if got else 0, source="runtime")
        return got

    # ------------------------------------------------------------ snapshots in memory
    def snapshot(self, step: int, state: State) -> None:
        """At every step boundary, every rank (a collective when one is due): keep `state` (a
        dict, or a function that returns it: called only when one is due) and this rank's RNG in
        memory for an in-job restart. A step just saved to disk takes none. `state` may hold
        tensors, numpy arrays, str/int/float/bool/None/bytes and dicts, lists and tuples of them;
        anything else raises a TypeError that names it (a snapshot is data, never pickled)."""
        snaps = self._snapshots()
        if snaps is None:
            return
        self._state, self._step = state, step
        try:
            snaps.step(step, saved=step == self._last_save)
        finally:
            self._state = None
        self.snapshot_every = snaps.every

    def close(self) -> None:
        """At the run's end, after its last save (done, or preempted): this node's snapshots of
        this job start removed. Every rank may call it; runtime.exit(0 or PREEMPTED) does."""
        if self._snaps is not None:
            self._snaps.close()

    def _snapshots(self) -> Snapshots | None:
        """Built once, at the first snapshot or load (every rank: it makes a process group)."""
        if not self._made:
            self._made = True
            recovery = _recovery()
            world = int(os.environ.get("WORLD_SIZE") or 1)
            if recovery.enabled(self.snapshot_every) and (_dist() is not None or world == 1):
                self._snaps = recovery.Snapshots(
                    self.dir.parent,
                    every=self.snapshot_every,
                    budget=snapshot_store.BUDGET,
                    payload=self._payload,
                    apply=self._apply,
                    log=_warn,
                )
                _closers.append(self.close)  # runtime.exit(0 or 75) frees them
        return self._snaps

    def _from_memory(self, disk_step: int, restore_rng: bool) -> Found | None:
        snaps = self._snapshots()
        if snaps is None:
            return None
        self._restore_rng = restore_rng
        step = snaps.restore(disk_step)
        state, self._restored = self._restored, None
        if step is None or state is None:
            return None
        return Found(step, state, snaps.exchange.folder, from_memory=True)

    def _payload(self) -> Payload:
        held = self._state() if callable(self._state) else self._state
        return {"state": dict(held or {}), "rng": _capture_rng(), "step": self._step}

    def _apply(self, thawed: dict[str, object]) -> int:
        """A snapshot loaded: its state kept for load(), the RNG restored; its step."""
        saved = cast(Payload, thawed)  # what _payload made, frozen and thawed
        if self._restore_rng:
            _restore_rng(saved["rng"])
        self._restored = saved["state"]
        return int(saved["step"])


def _recovery() -> ModuleType:
    from hpctrain.runtime import recovery  # lazy: torch on a torch-free path (runtime's import)

    return recovery


def _broadcast_text(dist: ModuleType, text: str | None) -> str | None:
    """Rank 0's `text` on every rank, as bytes (broadcast_object_list unpickles what it gets)."""
    torch, device = _torch(), _device(dist)
    raw = b"" if text is None else b"+" + text.encode()
    size = torch.tensor([len(raw)], dtype=torch.int64, device=device)
    dist.broadcast(size, src=0)
    box = torch.zeros(max(1, int(size.item())), dtype=torch.uint8, device=device)
    if raw and dist.get_rank() == 0:
        box[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(device)
    dist.broadcast(box, src=0)
    got = bytes(box[: int(size.item())].cpu().numpy())
    return got[1:].decode() if got else None


def _step_of(folder: Path) -> int:
    m = fmt.STEP_RE.match(folder.name)
    assert m is not None  # newest_verified only returns step folders
    return int(m.group(1))


def _to_bytes(obj: object) -> bytes:
    torch = _torch()
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _capture_rng() -> Rng:
    torch = _torch()
    out: Rng = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if "numpy" in sys.modules:  # the script uses numpy: its generator is part of the state
        out["numpy"] = sys.modules["numpy"].random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def _restore_rng(saved: Rng) -> None:
    torch = _torch()
    random.setstate(saved["python"])
    torch.set_rng_state(saved["torch"])
    if "numpy" in saved:
        import numpy as np  # lazy: numpy only for a state that holds its generator

        np.random.set_state(saved["numpy"])
    if "cuda" in saved and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])
