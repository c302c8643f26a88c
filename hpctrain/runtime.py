"""The runtime API for your own training script (`hpctrain submit --script train.py`).

    from hpctrain import runtime

    ckpt = runtime.Checkpoint()                  # <run folder>/checkpoints, train_entry's format
    found = ckpt.load()                          # the newest verified checkpoint, or None
    step = found.step if found else 0
    if found:
        model.load_state_dict(found.state["model"])
        optimizer.load_state_dict(found.state["optimizer"])
    while step < total:
        ...one optimizer step...
        step += 1
        if runtime.should_stop():                # the STOP file or a signal, agreed by all ranks
            ckpt.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict()})
            runtime.exit(runtime.PREEMPTED)      # 75: the batch shell requeues, the job resumes

`should_stop()`, `run_dir()`, `restart_count()` and `exit()` need no torch; `Checkpoint` imports it
when it saves or loads. Nothing here imports click. With torch.distributed initialised, every rank
must call `should_stop()` and `Checkpoint.save/load` at the same point (they are collectives).

A checkpoint is a `checkpoints/step-<8 digits>/` folder with a MANIFEST.json (every file with its
size and sha256) written last and a `checkpoints/latest` pointer, exactly like train_entry's, so
`hpctrain status`, `report` and `resume` read it the same way. Per rank, the RNG state (Python,
NumPy, torch CPU and CUDA) is saved and restored automatically; a data position is whatever you
put in the state dict (e.g. {"epoch": 1, "offset": 4096}).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.kernel import checkpoint as fmt  # the format: step names, manifest, verify, latest
from hpctrain.kernel import exitcodes, jobenv, layout
from hpctrain.kernel.files import utc_now
from hpctrain.kernel.rundir import RunFolder
from hpctrain.kernel.stopflag import DEFAULT_SIGNALS, StopFlag
from hpctrain.kernel.stopflag import die_with_launcher as die_with_launcher  # public here too

# The job environment this module reads (set by the rendered batch script, docs/design.md).
ENV_RUN_DIR = jobenv.RUN_DIR
ENV_STOP_FILE = jobenv.STOP_FILE
ENV_RESTART_COUNT = jobenv.RESTART_COUNT

PREEMPTED = exitcodes.PREEMPTED  # a verified checkpoint was saved because the stop flag was raised
STOP_SIGNALS = DEFAULT_SIGNALS
STATE_FILE = "state.pt"
SAVES = layout.SAVES  # one line per save: what `hpctrain report` sums


# ---------------------------------------------------------------- where am I
_chosen: list[Path] = []  # the folder a first run_dir(default) call chose, outside hpctrain


def run_dir(default: str | os.PathLike[str] | None = None) -> Path:
    """The run folder: the job environment's RUN_DIR under hpctrain, else `default`
    (remembered for later calls, e.g. from log_metrics), created if missing."""
    raw = os.environ.get(ENV_RUN_DIR)
    if raw:
        path = Path(raw).absolute()
    elif default is not None:
        path = Path(default).absolute()
        _chosen[:] = [path]
    elif _chosen:
        path = _chosen[0]
    else:
        raise RuntimeError(
            f"not running under hpctrain: ${ENV_RUN_DIR} is not set; submit with "
            "`hpctrain submit --script ...`, or call runtime.run_dir('runs/NAME') first"
        )
    path.mkdir(parents=True, exist_ok=True)
    return path


def restart_count() -> int:
    """How many times the batch script started this job again (0 on the first start)."""
    try:
        return int(os.environ.get(ENV_RESTART_COUNT, "0"))
    except ValueError:
        return 0


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def exit(code: int = 0, *, step: int | None = None) -> None:  # noqa: A001 - reads as what it does
    """Leave now. With PREEMPTED, rank 0 first records a `preempted` event (`step`, else the step of
    the last Checkpoint.save) in events.jsonl, as train_entry does. Then: flush, os._exit (torch
    2.13 + gloo can abort at interpreter exit after a finished run, which torchrun would report as
    a failure). The process group is not destroyed: the exit closes its connections, and gloo's
    destroy_process_group can hang one rank at the end (torch 2.7.1: 2 of 4 two-rank runs after
    the stop votes; once under 2.13), leaving the job there until its time limit."""
    step = step if step is not None else (_saved[-1] if _saved else None)
    if code == PREEMPTED and rank() == 0 and step is not None:
        _event({"event": "preempted", "step": step, "reason": _flag.reason})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _event(record: dict[str, Any]) -> None:
    try:
        folder = run_dir()
    except RuntimeError:
        return
    fields = dict(record)
    RunFolder(folder).event(fields.pop("event"), **fields, source="runtime")


_saved: list[int] = []  # steps this process saved (the last one goes into the preempted event)


# ---------------------------------------------------------------- the stop flag
# the torch-free flag train_entry uses too; should_stop() below is its agreement
_flag = StopFlag(STOP_SIGNALS)


def install() -> None:
    """Install the signal handlers now (should_stop() does it on its first call); main thread."""
    _flag.install()


def stop_reason() -> str | None:
    """Why this rank wants to stop (a signal name, the stop file, 'another rank'), or None."""
    return _flag.reason


def should_stop(*, wait: bool = True) -> bool:
    """True when the run must save and stop: the batch shell's STOP file exists (the scheduler's
    warning signal, `hpctrain preempt`) or SIGUSR1/USR2/TERM arrived. With torch.distributed
    initialised it is a collective: every rank gets the same answer (all-reduce MAX).

    wait=False holds no step: each call starts this boundary's vote (async) and answers the
    previous call's, so a stop lands one boundary later, still at the same step on every rank."""
    _flag.install()
    mine = _flag.local()
    dist = _dist()
    if dist is None:
        return mine
    torch = _torch()
    flag = torch.tensor([1 if mine else 0], dtype=torch.int32, device=_device(dist))
    if wait:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return _agreed(bool(flag.item()), mine)
    before = _pending[:]
    _pending[:] = [(dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True), flag)]
    if not before:
        return False
    work, old = before[0]
    work.wait()
    return _agreed(bool(old.item()), mine)


_pending: list[Any] = []  # should_stop(wait=False): the vote started at the previous boundary


def _agreed(agreed: bool, mine: bool) -> bool:
    if agreed and not mine:
        _flag.raise_("another rank")  # keeps this rank's own reason when it has one
    return agreed


def barrier() -> None:
    """Wait for every rank (no-op without a process group): e.g. before leaving after a save."""
    _barrier(_dist())


def _dist() -> Any:
    """torch.distributed when torch is already imported and a process group is up, else None."""
    if sys.modules.get("torch") is None:  # never imported (or blocked): no process group either
        return None
    import torch.distributed as dist  # lazy: torch is loaded (checked above); run_dir() needs none

    return dist if dist.is_available() and dist.is_initialized() else None


def _torch() -> Any:
    """torch, on first use: should_stop(), run_dir(), restart_count() and exit() need none (a script
    may call them before importing torch, and the launcher's tools import this module)."""
    import torch  # lazy: torch on a torch-free path (this module's torch-free half)

    return torch


def _device(dist: Any) -> Any:  # Any: torch objects (torch is imported lazily)
    torch = _torch()
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---------------------------------------------------------------- checkpoints
@dataclass
class Found:
    step: int
    state: dict[str, Any]
    path: Path


class Checkpoint:
    """Atomic, verified checkpoints of any state dict, in train_entry's format.

    save(step, state): rank 0 writes `state` (torch.save: tensors, optimizer state, plain data);
    every rank writes its RNG state; rank 0 then writes the manifest last, renames the staging
    folder to step-<N>, moves `latest` and keeps the newest `keep`. load(): the newest checkpoint
    whose manifest verifies (a damaged one is reported and skipped, never deleted), RNG restored.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str] | None = None,
        *,
        keep: int = 2,
        strategy: str = "script",
    ) -> None:
        if keep < 2:
            raise ValueError(f"keep={keep}: keep at least 2 (the newest may be half written)")
        self.dir = Path(folder).absolute() if folder else run_dir() / "checkpoints"
        self.keep, self.strategy = keep, strategy
        self.blocked_s: list[float] = []  # seconds each save held the loop

    # ------------------------------------------------------------ save
    def save(self, step: int, state: dict[str, Any]) -> Path:
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
            self._commit(fmt, staging, final, step, world, torch.__version__)
        _barrier(dist)
        self.blocked_s.append(time.monotonic() - t0)
        _saved.append(step)
        if me == 0:  # what `hpctrain report` sums as time lost to blocking saves
            rec = {"step": step, "blocked_s": self.blocked_s[-1], "time": time.time()}
            with contextlib.suppress(OSError, RuntimeError):
                RunFolder(run_dir()).append(SAVES, rec, sort_keys=False)
        return final

    def _commit(
        self,
        fmt: Any,  # Any: torch objects (torch is imported lazily)
        staging: Path,
        final: Path,
        step: int,
        world: int,
        torch_version: str,
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
        """The newest verified checkpoint (state on CPU), or None when there is none yet."""
        torch = _torch()
        dist = _dist()
        me = dist.get_rank() if dist else rank()  # before init_process_group (Lightning): RANK
        choice = None
        if me == 0 or dist is None:  # without a process group every process looks for itself
            found = fmt.newest_verified(self.dir, warn=_warn if me == 0 else None)
            choice = str(found[0]) if found else None
        if dist is not None:
            box = [choice]
            dist.broadcast_object_list(box, src=0)
            choice = box[0]
        if choice is None:
            return None
        folder = Path(choice)
        state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=False)
        rng = folder / "rng" / f"rank-{me:05d}.pt"
        if restore_rng and rng.exists():
            _restore_rng(torch.load(rng, map_location="cpu", weights_only=False))
        m = fmt.STEP_RE.match(folder.name)
        assert m is not None  # newest_verified only returns step folders
        step = int(m.group(1))
        if me == 0:
            _warn(f"resuming from {folder} (step {step})")
        return Found(step, state, folder)


_last: dict[str, float] = {}


def log_metrics(
    step: int, *, total: int | None = None, samples: int | None = None, **values: float
) -> None:
    """Rank 0 appends one line to <run>/metrics.jsonl, as train_entry does, so `hpctrain status`,
    `submit --wait` and `hpctrain report` show your script's progress: step, your values (loss,
    lr...), step_time_s and samples_per_s (from `samples` per step) since the previous call."""
    if rank() != 0:
        return
    now = time.time()
    rec: dict[str, Any] = {"step": step, **{k: float(v) for k, v in values.items()}}
    if "step" in _last and step > _last["step"]:
        dt = (now - _last["time"]) / (step - _last["step"])
        rec["step_time_s"] = dt
        if samples and dt > 0:
            rec["samples_per_s"] = samples / dt
    if total is not None:
        rec["max_steps"] = total
    rec["time"] = now
    _last.update(step=step, time=now)
    RunFolder(run_dir()).append(layout.METRICS, rec, sort_keys=False)


def params_sha256(module_or_state: Any) -> str:  # Any: torch objects (torch is imported lazily)
    """sha256 over every tensor of a module's state dict (or a state dict), in name order, with
    wrapper prefixes ("module.") stripped: two runs end bit-identical when the hashes match."""
    torch = _torch()
    sd = module_or_state.state_dict() if hasattr(module_or_state, "state_dict") else module_or_state
    h = hashlib.sha256()
    for key in sorted(sd, key=lambda k: k.removeprefix("module.")):
        t = sd[key]
        if isinstance(t, torch.Tensor):
            h.update(key.removeprefix("module.").encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------- helpers
def _warn(msg: str) -> None:
    print(f"[hpctrain runtime] {msg}", file=sys.stderr, flush=True)


def _barrier(dist: Any) -> None:  # Any: torch objects (torch is imported lazily)
    if dist is not None:
        dist.barrier()


def _to_bytes(obj: Any) -> bytes:  # Any: torch objects (torch is imported lazily)
    torch = _torch()
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _capture_rng() -> dict[str, Any]:
    torch = _torch()
    out: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if "numpy" in sys.modules:  # the script uses numpy: its generator is part of the state
        out["numpy"] = sys.modules["numpy"].random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def _restore_rng(saved: dict[str, Any]) -> None:
    torch = _torch()
    random.setstate(saved["python"])
    torch.set_rng_state(saved["torch"])
    if "numpy" in saved:
        import numpy as np  # lazy: numpy only for a state that holds its generator

        np.random.set_state(saved["numpy"])
    if "cuda" in saved and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["cuda"])
