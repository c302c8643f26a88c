"""A plain hand-written DDP loop, as the PyTorch guides write it: the baseline for train_entry's DDP.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/baselines/plain_ddp.py --max-steps 40 --out steps.json

Same model, data, batch and optimizer as train_entry (benchmarks/demo.py builds them from
train_entry's own demo and config); rank 0 writes the completion time of every step.
"""

import argparse
import contextlib
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import demo  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--max-steps", type=int, required=True)
ap.add_argument("--out", required=True)
args = ap.parse_args()

dist.init_process_group("gloo")
d = demo.build()
model = DDP(d.model)
opt = d.optimizer(model.parameters())
sched = d.scheduler(opt)
sampler: DistributedSampler[demo.Batch] = DistributedSampler(
    d.dataset, shuffle=True, seed=d.seed, drop_last=True
)
loader = DataLoader(
    d.dataset, batch_size=d.micro_batch, sampler=sampler, drop_last=True, collate_fn=d.collate
)
batches = demo.forever(loader, sampler)

clock = demo.StepClock()
for _step in range(args.max_steps):
    for micro in range(d.accum):
        sync = micro == d.accum - 1
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = d.loss(model, next(batches)) / d.accum
            loss.backward()
    if d.clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), d.clip)
    opt.step()
    if sched:
        sched.step()
    opt.zero_grad(set_to_none=True)
    loss.item()
    clock.tick()
clock.write(args.out)
dist.destroy_process_group()
# gloo can abort a finished worker at interpreter exit (train_entry.dist.exit_now)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
