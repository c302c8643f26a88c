"""A plain PyTorch DDP script that survives preemption with exact resume (hpctrain.runtime).

    hpctrain submit --nodes 2 --gpus 1 --script examples/ddp_torch.py --name ddp-demo \
        --wait -- --steps 200
    hpctrain preempt ddp-demo        # (while it runs) it saves, requeues and continues by itself
    hpctrain report ddp-demo         # loss / throughput plots in the run folder
    # without hpctrain:
    torchrun --standalone --nproc-per-node 2 examples/ddp_torch.py --run-dir runs/ddp-local

What it shows: `runtime.should_stop()` at every step boundary (the scheduler's warning signal or
`hpctrain preempt`, agreed by all ranks), `runtime.Checkpoint` saving model + optimizer + data
position (+ each rank's RNG, automatically) with train_entry's manifest and `latest` pointer, and
`runtime.exit(runtime.PREEMPTED)` so the batch script requeues. A restarted job loads the newest
verified checkpoint and ends bit-identical to an uninterrupted run (final_params.sha256).
`ckpt.snapshot(step, state)` at every step keeps the state in memory every few steps (`--snapshot-every`,
default auto: under 2% of the step time): when a rank dies, the job restarts its workers in place
and `ckpt.load()` returns that snapshot, so only the steps since it are redone (docs/recovery.md).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hpctrain import runtime
from hpctrain.kernel import jobenv

DATA = torch.randn(4096, 16, generator=torch.Generator().manual_seed(0))


def batch_for(step: int, rank: int, world: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data: a fixed table, and step s of rank r reads a fixed slice of it, so the data
    position is just the step (saved in the checkpoint with the weights)."""
    idx = (torch.arange(micro) + (step * world + rank) * micro) % len(DATA)
    x = DATA[idx]
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--steps", type=int, default=100, help="optimizer steps in total (across restarts)"
    )
    p.add_argument("--micro", type=int, default=8, help="samples per rank per step")
    p.add_argument("--save-every", type=int, default=20, help="periodic checkpoint every N steps")
    p.add_argument(
        "--sleep", type=float, default=0.0, help="seconds to pause per step (demos/tests)"
    )
    p.add_argument(
        "--snapshot-every",
        type=int,
        default=None,
        help="in-memory snapshot every N steps for in-job restarts (default: auto; 0: off)",
    )
    p.add_argument("--run-dir", default=None, help="run folder when not under hpctrain")
    args = p.parse_args()

    cuda = torch.cuda.is_available() and jobenv.get(jobenv.DEVICE) != "cpu"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    )
    if cuda:
        torch.cuda.set_device(device)
    runtime.run_dir(args.run_dir)  # fails early, with how to fix it, when there is no run folder

    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 1)).to(
        device
    )
    # the same gradient buckets at every start: exact resumes with more than 2 ranks
    ddp = runtime.fix_ddp_buckets(DDP(model, device_ids=[device.index] if cuda else None))
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    torch.manual_seed(1000 + rank)  # dropout differs per rank; its RNG state is checkpointed

    folder = runtime.run_dir(args.run_dir) / "checkpoints"
    ckpt = runtime.Checkpoint(folder, snapshot_every=args.snapshot_every)
    step = 0
    found = ckpt.load()  # after an in-job restart: a newer snapshot in memory, if every rank has it
    if found is not None:
        model.load_state_dict(found.state["model"])
        opt.load_state_dict(found.state["optimizer"])
        step = found.state["step"]
    if rank == 0:
        whence = "memory" if found and found.from_memory else "disk" if found else "start"
        print(
            f"world {world}, restart {runtime.restart_count()}, step {step}/{args.steps} "
            f"(from {whence})",
            flush=True,
        )

    def state() -> dict[str, object]:
        return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}

    while step < args.steps:
        x, y = (t.to(device) for t in batch_for(step, rank, world, args.micro))
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        runtime.log_metrics(step, total=args.steps, loss=loss.item(), samples=args.micro * world)
        if args.sleep:
            time.sleep(args.sleep)
        if step % args.save_every == 0 and step < args.steps:
            ckpt.save(step, state())
        ckpt.snapshot(step, state)  # every rank, every step: in memory when one is due
        if runtime.should_stop():  # every rank, every step: a collective
            ckpt.save(step, state())
            ckpt.close()
            if rank == 0:
                print(
                    f"stopped at step {step} ({runtime.stop_reason()}): saved, exit 75", flush=True
                )
            runtime.exit(runtime.PREEMPTED)

    ckpt.save(step, state())
    ckpt.close()  # the snapshots' memory freed
    if rank == 0:
        digest = runtime.params_sha256(model)
        (runtime.run_dir(args.run_dir) / "final_params.sha256").write_text(digest + "\n")
        print(f"done: {step} steps, final params sha256 {digest[:16]}...", flush=True)
    runtime.exit(0)


if __name__ == "__main__":
    main()
