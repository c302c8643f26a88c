"""Where a user script runs and when it must stop: the run folder, restart counts, the stop flag
agreed by all ranks, `exit`, metrics lines and the params hash. Nothing here imports torch until a
process group is up (`_dist`) or a function needs it (`_torch`).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from hpctrain.kernel import exitcodes, fatal, jobenv, layout
from hpctrain.kernel.rundir import RunFolder
from hpctrain.kernel.stopflag import DEFAULT_SIGNALS, StopFlag
from hpctrain.kernel.stopflag import die_with_launcher as die_with_launcher  # public here too

if TYPE_CHECKING:
    import torch
    from torch.distributed import Work
    from torch.nn.parallel import DistributedDataParallel

# The job environment this module reads (set by the rendered batch script, docs/design.md).
ENV_RUN_DIR = jobenv.RUN_DIR
ENV_STOP_FILE = jobenv.STOP_FILE
ENV_RESTART_COUNT = jobenv.RESTART_COUNT

PREEMPTED = exitcodes.PREEMPTED  # a verified checkpoint was saved because the stop flag was raised
STOP_SIGNALS = DEFAULT_SIGNALS


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
    the last Checkpoint.save) in events.jsonl, as train_entry does. With 0 or PREEMPTED every
    Checkpoint's snapshots in memory are freed (Checkpoint.close). Then: flush, os._exit (torch
    2.13 + gloo can abort at interpreter exit after a finished run, which torchrun would report as
    a failure). The process group is not destroyed: the exit closes its connections, and gloo's
    destroy_process_group can hang one rank at the end (torch 2.7.1: 2 of 4 two-rank runs after
    the stop votes; once under 2.13), leaving the job there until its time limit."""
    step = step if step is not None else (_saved[-1] if _saved else None)
    if code == PREEMPTED and rank() == 0 and step is not None:
        _event("preempted", step=step, reason=_flag.reason)
    if code in (0, PREEMPTED):  # the run's end or its stop: this start's snapshots are done with
        for close in _closers:
            close()
    fatal.left_preempted(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _event(name: str, **fields: object) -> None:
    try:
        folder = run_dir()
    except RuntimeError:
        return
    RunFolder(folder).event(name, **fields, source="runtime")


_saved: list[int] = []  # steps this process saved (the last one goes into the preempted event)
_closers: list[Callable[[], None]] = []  # Checkpoint.close of each Checkpoint with snapshots


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


# should_stop(wait=False): the vote started at the previous boundary, and its flag
_pending: list[tuple[Work, torch.Tensor]] = []


def _agreed(agreed: bool, mine: bool) -> bool:
    if agreed and not mine:
        _flag.raise_("another rank")  # keeps this rank's own reason when it has one
    return agreed


def barrier() -> None:
    """Wait for every rank (no-op without a process group): e.g. before leaving after a save."""
    _barrier(_dist())


def _dist() -> ModuleType | None:
    """torch.distributed when torch is already imported and a process group is up, else None."""
    if sys.modules.get("torch") is None:  # never imported (or blocked): no process group either
        return None
    import torch.distributed as dist  # lazy: torch is loaded (checked above); run_dir() needs none

    return dist if dist.is_available() and dist.is_initialized() else None


def _torch() -> ModuleType:
    """torch, on first use: should_stop(), run_dir(), restart_count() and exit() need none (a script
    may call them before importing torch, and the launcher's tools import this module)."""
    import torch  # lazy: torch on a torch-free path (this module's torch-free half)

    return torch


def _device(dist: ModuleType) -> torch.device:
    th = _torch()
    gpu = dist.get_backend() == "nccl"
    device: torch.device = th.device("cuda", th.cuda.current_device()) if gpu else th.device("cpu")
    return device


# ---------------------------------------------------------------- checkpoints

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
    rec: dict[str, object] = {"step": step, **{k: float(v) for k, v in values.items()}}
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


def params_sha256(module_or_state: torch.nn.Module | Mapping[str, object]) -> str:
    """sha256 over every tensor of a module's state dict (or a state dict), in name order, with
    wrapper prefixes ("module.") stripped: two runs end bit-identical when the hashes match."""
    torch = _torch()
    if isinstance(module_or_state, Mapping):
        sd = module_or_state
    else:
        sd = module_or_state.state_dict()
    h = hashlib.sha256()
    for key in sorted(sd, key=lambda k: k.removeprefix("module.")):
        t = sd[key]
        if isinstance(t, torch.Tensor):
            h.update(key.removeprefix("module.").encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fix_ddp_buckets(ddp: DistributedDataParallel) -> DistributedDataParallel:
    """Fix a DistributedDataParallel model's gradient buckets now, the same at every start; returns
    it. DDP otherwise rebuilds its buckets after the first step in gradient-ready order, which moves
    gradients to other offsets of the ring all-reduce: with more than 2 ranks that is another
    summation order, and a resumed run (its first step on the initial layout) drifts from an
    uninterrupted one in the last bits. Not with find_unused_parameters (DDP's own call then)."""
    if not ddp.find_unused_parameters:
        ddp.reducer._push_all_rebuilt_params()  # what DDP does itself in _update_process_group
        ddp.reducer._rebuild_buckets()
    return ddp


# ---------------------------------------------------------------- helpers
def _warn(msg: str) -> None:
    print(f"[hpctrain runtime] {msg}", file=sys.stderr, flush=True)


def _barrier(dist: ModuleType | None) -> None:
    if dist is not None:
        dist.barrier()
