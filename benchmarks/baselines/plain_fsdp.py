"""A plain hand-written FSDP2 loop (fully_shard per block, then the root), as the PyTorch FSDP2
tutorial writes it: the baseline for train_entry's fsdp strategy.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/baselines/plain_fsdp.py --max-steps 40 --out steps.json
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import demo  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--max-steps", type=int, required=True)
ap.add_argument("--out", required=True)
args = ap.parse_args()

dist.init_process_group("gloo")
d = demo.build()
model = d.model
for block in d.blocks(model):
    fully_shard(block)
fsdp = fully_shard(model)  # the same module, typed with FSDP2's methods
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
        fsdp.set_requires_gradient_sync(micro == d.accum - 1)
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
