"""A plain hand-written pipeline-parallel loop, as the torch.distributed.pipelining tutorial and
torchtitan write it: the baseline for train_entry's `--parallel.pp N` (FSDP2 x PP on one mesh).

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/baselines/plain_pp.py --pp 2 --max-steps 40 --out steps.json

A ("pp", "dp") mesh; rank r of "pp" keeps layers [r L/p, (r+1) L/p) of the GPT (the first stage
the embeddings, the last the final norm, the head and the loss), fully_shard of its blocks and the
stage over "dp", one PipelineStage and a schedule (1F1B by default, pp micro-batches per
micro-step); the gradient norm's squares are summed over "pp" for the clip. Same model, data,
batch and optimizer as train_entry (benchmarks/demo.py); rank 0 writes every step's end.

With --bubble it measures the schedule instead: the time of one forward+backward pass over m
micro-batches of a fixed size for several m, fitted as T(m) = a + s m (s: one slot per
micro-batch); the measured idle share at each m is 1 - s m / T(m), against (p-1)/(m+p-1).
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import pipelining
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining.schedules import PipelineScheduleSingle
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import demo  # noqa: E402
from train_entry.model import GPT  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--pp", type=int, required=True)
ap.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b"])
ap.add_argument("--max-steps", type=int, required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--bubble", default="", help="comma-separated micro-batch counts to time")
args = ap.parse_args()


class Stage(nn.Module):
    def __init__(self, gpt: GPT, lo: int, hi: int, first: bool, last: bool) -> None:
        super().__init__()
        self.tok: nn.Module | None = gpt.tok if first else None
        self.pos: nn.Module | None = gpt.pos if first else None
        self.blocks = nn.ModuleList(gpt.blocks[lo:hi])
        self.ln_f: nn.Module | None = gpt.ln_f if last else None
        self.head: nn.Module | None = gpt.head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None and self.pos is not None:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        for block in self.blocks:
            x = block(x)
        if self.head is not None and self.ln_f is not None:
            x = self.head(self.ln_f(x)).float()
        return x


dist.init_process_group("gloo")
world = dist.get_world_size()
mesh = init_device_mesh("cpu", (args.pp, world // args.pp), mesh_dim_names=("pp", "dp"))
rank, p = mesh["pp"].get_local_rank(), args.pp
d = demo.build()
assert isinstance(d.model, GPT)  # the stages take the demo GPT's layers
per = len(d.model.blocks) // p
stage_mod = Stage(d.model, rank * per, (rank + 1) * per, rank == 0, rank == p - 1)
for block in stage_mod.blocks:
    fully_shard(block, mesh=mesh["dp"])
fsdp = fully_shard(stage_mod, mesh=mesh["dp"])  # the same module, typed with FSDP2's methods
params = list(stage_mod.parameters())
opt = d.optimizer(params)
sched = d.scheduler(opt)
stage = pipelining.PipelineStage(
    stage_mod, rank, p, torch.device("cpu"), group=mesh["pp"].get_group()
)


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.flatten(0, 1), target.flatten(), ignore_index=-100) / d.accum


cls = pipelining.ScheduleGPipe if args.schedule == "gpipe" else pipelining.Schedule1F1B
dp = mesh["dp"]
sampler: DistributedSampler[demo.Batch] = DistributedSampler(
    d.dataset,
    num_replicas=dp.size(),
    rank=dp.get_local_rank(),
    shuffle=True,
    seed=d.seed,
    drop_last=True,
)


def run(schedule: PipelineScheduleSingle, batch: demo.Batch) -> None:
    """One pass of the schedule over a batch: forward and backward of all its micro-batches."""
    x, y = batch["idx"], batch["targets"]
    if rank == 0:
        schedule.step(x)
    elif rank == p - 1:
        schedule.step(target=y, losses=[])
    else:
        schedule.step()


if args.bubble:  # time one pass at several micro-batch counts of a fixed micro-batch size
    size = d.micro_batch // p
    out = {"p": p, "micro_batch_size": size, "schedule": args.schedule, "passes": {}}
    for m in [int(x) for x in args.bubble.split(",")]:
        schedule = cls(stage, n_microbatches=m, loss_fn=loss_fn)
        batch = next(iter(DataLoader(d.dataset, batch_size=size * m, collate_fn=d.collate)))
        times = []
        for i in range(args.max_steps):
            dist.barrier(group=mesh["pp"].get_group())
            t0 = time.perf_counter()
            run(schedule, batch)
            dist.barrier(group=mesh["pp"].get_group())
            if i >= 2:  # warm-up passes
                times.append(time.perf_counter() - t0)
            opt.zero_grad(set_to_none=True)
        out["passes"][m] = sorted(times)[len(times) // 2]
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(out))
else:
    schedule = cls(stage, n_microbatches=p, loss_fn=loss_fn)
    loader = DataLoader(
        d.dataset, batch_size=d.micro_batch, sampler=sampler, drop_last=True, collate_fn=d.collate
    )
    batches = demo.forever(loader, sampler)
    clock = demo.StepClock()
    for _step in range(args.max_steps):
        for micro in range(d.accum):
            fsdp.set_requires_gradient_sync(micro == d.accum - 1)
            run(schedule, next(batches))
        if d.clip:
            grads = [q.grad for q in params if q.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            norm = norm**2
            dist.all_reduce(norm, group=mesh["pp"].get_group())
            torch.nn.utils.clip_grads_with_norm_(params, d.clip, norm.sqrt(), foreach=True)
        opt.step()
        if sched:
            sched.step()
        opt.zero_grad(set_to_none=True)
        clock.tick()
    clock.write(args.out)
dist.destroy_process_group()
# gloo can abort a finished worker at interpreter exit (train_entry.dist.exit_now)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
