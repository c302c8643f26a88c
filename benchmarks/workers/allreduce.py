"""Both sides of the collective row (benchmarks/collective.py) in one pair of processes: the
all-reduce sweep `hpctrain doctor` runs (hpctrain.checks.doctor.allreduce, size by size) and a
bare all-reduce as nccl-tests times it (`bare`: 5 warm-up calls, 20 timed ones between
barriers), the bare one twice (the noise row). For each repetition and size the three run back to
back, their order rotating, so a load change lands on all of them; rank 0 writes {"sizes",
"busbw": {side: [[per size] per repetition]}}.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        -m benchmarks.workers.allreduce OUT.json REPS MAX_BYTES
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from hpctrain.checks.doctor.allreduce import _size as doctor_size
from hpctrain.checks.doctor.report import sweep_sizes


def bare(nbytes: int, world: int, warmup: int = 5, iters: int = 20) -> float:
    """The bare baseline for one size: bus bandwidth, bytes/s (busbw = algbw * 2 (n - 1) / n)."""
    x = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
    for _ in range(warmup):
        dist.all_reduce(x)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    dist.barrier()
    t = (time.perf_counter() - t0) / iters
    return x.numel() * 4 / t * 2 * (world - 1) / world


def main() -> None:
    out, reps, max_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cpu = torch.device("cpu")
    sides = {
        "doctor": lambda n: doctor_size(n, device=cpu, rank=rank, world=world)["busbw_gbps"] * 1e9,
        "bare": lambda n: bare(n, world),
        "bare_2": lambda n: bare(n, world),
    }
    names = list(sides)
    sizes = sweep_sizes(max_bytes)
    busbw: dict[str, list[list[float]]] = {k: [] for k in names}
    for r in range(reps):
        for k in names:
            busbw[k].append([])
        for i, n in enumerate(sizes):
            j = (r + i) % len(names)
            for k in names[j:] + names[:j]:
                busbw[k][-1].append(sides[k](n))
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"sizes": sizes, "world": world, "busbw": busbw}, f)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # gloo can abort a finished worker at interpreter exit


if __name__ == "__main__":
    main()
