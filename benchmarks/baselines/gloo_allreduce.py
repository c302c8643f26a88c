"""Bare gloo all-reduce sweep, as nccl-tests measures it: the baseline for `hpctrain doctor`.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/baselines/gloo_allreduce.py --sizes 1024,1048576 --out sweep.json

For each size (bytes, float32): warm-up, then `iters` timed all-reduces (SUM) between barriers.
algbw = bytes / time; busbw = algbw * 2 (n - 1) / n (nccl-tests' all-reduce factor).
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--sizes", required=True, help="comma-separated sizes in bytes")
ap.add_argument("--iters", type=int, default=20)
ap.add_argument("--warmup", type=int, default=5)
ap.add_argument("--out", required=True)
args = ap.parse_args()

dist.init_process_group("gloo")
n = dist.get_world_size()
rows = []
for size in map(int, args.sizes.split(",")):
    x = torch.ones(max(1, size // 4), dtype=torch.float32)
    iters = args.iters if size <= (16 << 20) else max(3, args.iters // 4)
    for _ in range(args.warmup):
        dist.all_reduce(x)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    dist.barrier()
    t = (time.perf_counter() - t0) / iters
    algbw = x.numel() * 4 / t
    rows.append(
        {
            "bytes": x.numel() * 4,
            "time_s": t,
            "algbw_Bps": algbw,
            "busbw_Bps": algbw * 2 * (n - 1) / n,
        }
    )
if dist.get_rank() == 0:
    with open(args.out, "w") as f:
        json.dump({"world_size": n, "sizes": rows}, f)
dist.destroy_process_group()
# gloo can abort a finished worker at interpreter exit (train_entry.dist.exit_now)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
