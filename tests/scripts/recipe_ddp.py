"""A plain DDP script with hpctrain's runtime API: preempted, killed or requeued, it resumes exactly.

hpctrain submit --nodes 2 --gpus 2 --name mine --script train.py --wait -- --steps 300
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hpctrain import runtime

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--save-every", type=int, default=50)  # a killed node redoes at most this many
args = p.parse_args()

dist.init_process_group("gloo")  # "nccl" on GPUs (and move the model and the data there)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)  # the same data and initial weights on every rank
data = torch.randn(4096, 16)
model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 1))
ddp = runtime.fix_ddp_buckets(DDP(model))  # the same gradient buckets at every start
optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
torch.manual_seed(1 + rank)  # dropout differs per rank; each rank's RNG state is checkpointed

ckpt = runtime.Checkpoint()  # <run folder>/checkpoints
found = ckpt.load()  # the newest verified checkpoint (this rank's RNG restored), or None
step = found.step if found else 0
if found:
    model.load_state_dict(found.state["model"])
    optimizer.load_state_dict(found.state["optimizer"])


def state():
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


while step < args.steps:
    x = data[(torch.arange(8) + (step * world + rank) * 8) % len(data)]  # the data of `step`
    loss = nn.functional.mse_loss(ddp(x), x.sum(1, keepdim=True).sin())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    runtime.log_metrics(step, total=args.steps, loss=loss.item(), samples=8 * world)
    ckpt.snapshot(step, state)  # in memory when due: a restart inside the job redoes few steps
    stop = runtime.should_stop()  # every rank, every step: the same answer on all
    if stop or step % args.save_every == 0 or step == args.steps:
        ckpt.save(step, state())  # every rank calls it
    if stop:
        runtime.exit(runtime.PREEMPTED)  # exit 75: the job is requeued and resumes here

if rank == 0:
    print(f"done: {step} steps, params sha256 {runtime.params_sha256(model)}", flush=True)
runtime.exit(0)  # skips torch.distributed's teardown, which can hang a rank
