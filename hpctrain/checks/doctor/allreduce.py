"""The doctor's all-reduce sweep on every rank under torchrun (worker.py runs it after the node
checks): over the real backend (nccl on GPUs, gloo on CPU), time, algorithm and bus bandwidth per
size like nccl-tests, and every sum checked. Group rank 0 writes `sweep.json`; a rank that fails
writes `sweep-error-<rank>.json`. This module imports torch: worker.py loads it only for the sweep.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.checks.doctor.report import SweepRow, sweep_sizes, write_report
from hpctrain.kernel import jobenv

WARMUP, ITERS = 5, 20  # nccl-tests' -w and -n defaults


def sweep(out: Path, *, max_bytes: int, timeout_s: float) -> int:
    """Every size up to `max_bytes`; the exit code (1: the process group or a collective failed)."""
    cuda = jobenv.get(jobenv.DEVICE, "cpu") == "cuda" and torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    rank = int(os.environ.get("RANK", "0"))
    failed = out / f"sweep-error-{rank}.json"
    try:
        if cuda:
            torch.cuda.set_device(
                int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count())
            )
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    except Exception as e:  # noqa: BLE001 - reported with its likely cause, not re-raised
        write_report(failed, {"error": f"{type(e).__name__}: {e}", "backend": backend})
        return 1
    world = dist.get_world_size()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    rows: list[SweepRow] = []
    try:
        for nbytes in sweep_sizes(max_bytes):
            rows.append(_size(nbytes, device=device, rank=rank, world=world))
    except Exception as e:  # noqa: BLE001
        write_report(failed, {"error": f"{type(e).__name__}: {e}", "backend": backend})
        return 1
    finally:
        if rows and rank == 0:
            done = {"backend": backend, "world": world, "dtype": "float32", "rows": rows}
            write_report(out / "sweep.json", done)
    if (
        dist.get_backend() != "gloo"
    ):  # gloo's may hang a rank (train_entry/compat.py); exit closes it
        dist.destroy_process_group()
    return 0


def _size(nbytes: int, *, device: torch.device, rank: int, world: int) -> SweepRow:
    """One size, nccl-tests' method: warm-up, then `iters` timed calls between barriers; 20 calls
    (its -n default) unless the probe says that takes over 1 s (large sizes on CPU)."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    count = nbytes // 4
    buf = torch.empty(count, dtype=torch.float32, device=device)
    buf.fill_(1.0)
    t1 = time.perf_counter()
    dist.all_reduce(buf)  # the first call sets up connections and buffers
    sync()
    probe = torch.tensor([time.perf_counter() - t1], dtype=torch.float64, device=device)
    dist.all_reduce(probe, op=dist.ReduceOp.MAX)  # every rank must agree on the counts
    each = max(float(probe.item()), 1e-6)
    iters = max(3, min(ITERS, int(1.0 / each)))
    for _ in range(min(WARMUP, iters)):
        dist.all_reduce(buf)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    sync()
    dist.barrier()
    elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank, as nccl-tests
    buf.fill_(float(rank + 1))
    dist.all_reduce(buf)
    ok = torch.tensor(
        [bool(torch.all(buf == world * (world + 1) / 2))], dtype=torch.int32, device=device
    )
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    t = float(elapsed.item())
    algbw = nbytes / t / 1e9
    return {
        "bytes": nbytes,
        "count": count,
        "time_us": t * 1e6,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * 2 * (world - 1) / world,
        "correct": bool(ok.item()),
    }
