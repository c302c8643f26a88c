"""A plain hand-written tensor-parallel loop, as the PyTorch TP tutorial and torchtitan write it:
the baseline for train_entry's `--parallel.tp N` (FSDP2 x TP on one DeviceMesh).

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/baselines/plain_tp.py --tp 2 --max-steps 40 --out steps.json

A ("dp", "tp") mesh; Megatron's plan with parallelize_module (attention and MLP as colwise then
rowwise pairs, sequence parallel norms, vocabulary-parallel embedding and logits, the loss under
loss_parallel), then fully_shard of every block and the root over "dp"; tp peers read the same
data shard. Same model, data, batch and optimizer as train_entry (benchmarks/demo.py); rank 0
writes the completion time of every step.
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import demo  # noqa: E402
from train_entry.model import GPT  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--tp", type=int, required=True)
ap.add_argument("--max-steps", type=int, required=True)
ap.add_argument("--out", required=True)
args = ap.parse_args()

dist.init_process_group("gloo")
world = dist.get_world_size()
mesh = init_device_mesh("cpu", (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
d = demo.build()
model = d.model
assert isinstance(model, GPT)  # the plan below names the demo GPT's layers
parallelize_module(
    model,
    mesh["tp"],
    {
        "tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "pos": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
        "ln_f": SequenceParallel(),
        "head": ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False
        ),
    },
)
for block in model.blocks:
    parallelize_module(
        block,
        mesh["tp"],
        {
            "ln1": SequenceParallel(),
            "qkv": ColwiseParallel(input_layouts=Shard(1)),
            "proj": RowwiseParallel(output_layouts=Shard(1)),
            "ln2": SequenceParallel(),
            "mlp.0": ColwiseParallel(input_layouts=Shard(1)),
            "mlp.2": RowwiseParallel(output_layouts=Shard(1)),
        },
    )
for block in model.blocks:
    fully_shard(block, mesh=mesh["dp"])
fsdp = fully_shard(model, mesh=mesh["dp"])  # the same module, typed with FSDP2's methods
opt = d.optimizer(model.parameters())
sched = d.scheduler(opt)
dp = mesh["dp"]
sampler: DistributedSampler[demo.Batch] = DistributedSampler(
    d.dataset,
    num_replicas=dp.size(),
    rank=dp.get_local_rank(),
    shuffle=True,
    seed=d.seed,
    drop_last=True,
)
loader = DataLoader(
    d.dataset, batch_size=d.micro_batch, sampler=sampler, drop_last=True, collate_fn=d.collate
)
batches = demo.forever(loader, sampler)

clock = demo.StepClock()
for _step in range(args.max_steps):
    for micro in range(d.accum):
        fsdp.set_requires_gradient_sync(micro == d.accum - 1)
        with loss_parallel():
            loss = d.loss(model, next(batches)) / d.accum
            loss.backward()
    if d.clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), d.clip)
    opt.step()
    if sched:
        sched.step()
    opt.zero_grad(set_to_none=True)
    loss.full_tensor().item() if hasattr(loss, "full_tensor") else loss.item()
    clock.tick()
clock.write(args.out)
dist.destroy_process_group()
# gloo can abort a finished worker at interpreter exit (train_entry.dist.exit_now)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
