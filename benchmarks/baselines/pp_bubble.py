"""The pipeline bubble of a plain 1F1B schedule (benchmarks/parallel.py's bubble row): the time of
one forward+backward pass over m micro-batches of a fixed size for several m, fitted as
T(m) = a + s m (s: one slot per micro-batch); the measured idle share at each m is
1 - s m / T(m), against (p-1)/(m+p-1).

    BENCH_TRAIN_ARGS='[..., "--parallel.pp=2"]' python -m torch.distributed.run --standalone \
        --nproc-per-node 2 benchmarks/baselines/pp_bubble.py --passes 12 --out bubble.json 2,4,8

The pipeline is benchmarks/baselines/loops.py's plain one (the torch.distributed.pipelining
tutorial's set-up), the same model, data and optimizer as train_entry (benchmarks/demo.py).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.baselines.loops import Pipeline  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b"])
ap.add_argument("--passes", type=int, required=True)
ap.add_argument("--out", required=True)
ap.add_argument("microbatches", help="comma-separated micro-batch counts to time")
args = ap.parse_args()

dist.init_process_group("gloo")
pipe = Pipeline.build()
size = pipe.d.micro_batch // pipe.p
out: dict[str, object] = {"p": pipe.p, "micro_batch_size": size, "schedule": args.schedule}
passes = {}
group = pipe.mesh["pp"].get_group()
for m in [int(x) for x in args.microbatches.split(",")]:
    schedule = pipe.schedule(m, args.schedule)
    batch = next(iter(DataLoader(pipe.d.dataset, batch_size=size * m, collate_fn=pipe.d.collate)))
    times = []
    for i in range(args.passes):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        pipe.run(schedule, batch)
        dist.barrier(group=group)
        if i >= 2:  # warm-up passes
            times.append(time.perf_counter() - t0)
        for q in pipe.params:
            q.grad = None
    passes[m] = sorted(times)[len(times) // 2]
out["passes"] = passes
if dist.get_rank() == 0:
    Path(args.out).write_text(json.dumps(out))
dist.destroy_process_group()
# gloo can abort a finished worker at interpreter exit (train_entry.dist.exit_now)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
