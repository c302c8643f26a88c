"""Process group init and teardown: NCCL + CUDA on GPU machines, gloo + CPU otherwise, chosen at run time.

Works under torchrun and under `srun` alone (the script sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/
MASTER_PORT in each task: torch's env:// init needs no torchrun agent) and as a plain single process
(a one-rank gloo group on an in-memory store), so the same code path serves tests and references.
"""

from __future__ import annotations

import ctypes
import os
import random
import sys
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from hpctrain.kernel import jobenv
from hpctrain.kernel.stopflag import die_with_launcher
from train_entry.compat import GLOO_DESTROY_HANGS


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def pick_device() -> str:
    """cuda when the node has GPUs and the job environment's DEVICE does not say cpu (we re-check
    the script's guess)."""
    if (jobenv.get(jobenv.DEVICE) or "").lower() == "cpu":
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def init_distributed(*, timeout_min: float = 10.0, seed: int = 0) -> DistInfo:
    """Join the process group (once) and seed this rank. Call before building the model."""
    if (jobenv.get(jobenv.DEVICE) or "").lower() != "cpu":
        # Read once, when CUDA initialises: set it before anything touches CUDA (fewer
        # fragmentation OOMs). Harmless if this turns out to be a CPU run.
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    kind = pick_device()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if kind == "cuda":
        # torchrun shows a worker every GPU of the node; `srun --gpus-per-task=1` shows it one (its
        # own, as device 0): LOCAL_RANK modulo the visible devices is right in both. On ROCm, torch's
        # "cuda" is HIP and its "nccl" backend is RCCL.
        index = local_rank % max(1, torch.cuda.device_count())
        torch.cuda.set_device(index)
        device, backend = torch.device("cuda", index), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        keep_freed_memory()
    if not dist.is_initialized():
        # Before joining: a worker whose torchrun is killed during the rendezvous must not wait out
        # the process-group timeout as an orphan.
        die_with_launcher()
        timeout = timedelta(minutes=timeout_min)
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(
                backend, timeout=timeout, device_id=device if kind == "cuda" else None
            )
        else:  # a plain `python -m train_entry`: one rank, no network
            store = dist.HashStore()  # type: ignore[attr-defined]  # not in torch's stubs' exports
            dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
    seed_rank(seed, rank)
    return DistInfo(rank, dist.get_world_size(), local_rank, device, backend)


HEAP_KEEP_BYTES = 32 * 2**20  # glibc's largest mmap threshold on 64-bit


def keep_freed_memory() -> bool:
    """CPU training: let glibc keep freed blocks up to HEAP_KEEP_BYTES in its heap.

    Each step allocates and frees the same activations (a few MiB each). glibc serves blocks
    above its mmap threshold (128 KiB at first) with a fresh mmap, whose pages fault in (zeroed) at every step, and
    only raises that threshold after some frees, so whether a run pays it depends on what the
    process did before (measured: 3-6 ms more per forward of the benchmark's GPT, 10-20% of
    it). A fixed threshold and trim limit reuse the heap instead. Linux/glibc only; False where
    not applied. (Set MALLOC_MMAP_THRESHOLD_ yourself to choose another value: it is then left.)
    """
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    ok = libc.mallopt(m_mmap_threshold, HEAP_KEEP_BYTES) == 1
    return bool(ok and libc.mallopt(m_trim_threshold, 4 * HEAP_KEEP_BYTES) == 1)


def seed_rank(seed: int, rank: int) -> None:
    """Deterministic per-rank RNG (dropout etc.) from (seed, rank); model init reseeds with seed alone."""
    s = (seed * 1_000_003 + rank) % 2**32
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)


def teardown() -> None:
    """Destroy the process group, except a gloo one (compat.GLOO_DESTROY_HANGS): every caller
    leaves through exit_now right after, and the exit closes the connections."""
    if not dist.is_initialized():
        return
    if GLOO_DESTROY_HANGS and dist.get_backend() == "gloo":
        return
    dist.destroy_process_group()


def exit_now(code: int) -> None:
    """Exit without running C++ static destructors, after the process group is gone.

    With gloo (FSDP2 runs most often), a worker that has finished, saved and destroyed its process
    group sometimes aborts at interpreter exit with "terminate called without an active exception"
    (2 in 10 two-rank runs measured), which torchrun reports as a failed job. Every file is closed by
    then; flush what Python buffers and leave.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
