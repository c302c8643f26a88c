"""The torchrun worker the checkpoint tests launch: a tiny, complete training loop over the
Checkpointer/StopFlag interface (no test functions here).

    torchrun --standalone --nproc-per-node 2 tests/test_checkpoint_worker.py \
        --run-dir /tmp/r --strategy ddp --steps 8 --every 2 --accum 2

Dropout (per-rank RNG), a shuffled dataset (data position), AdamW + LambdaLR (optimizer and
scheduler state) and gradient accumulation make every piece of TrainState matter for bit-identity.
Test hooks (hpctrain/kernel/jobenv.py): STOP_AT_STEP (StopFlag); TEST_SIGNAL_AT / TEST_KILL_AT
= "step:micro": rank 0 sends itself SIGUSR2 / SIGKILL during that micro-step of that step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hpctrain.kernel import jobenv
from train_entry.checkpoint import Checkpointer
from train_entry.dist import teardown
from train_entry.preempt import PREEMPTED_EXIT, StopFlag
from train_entry.state import TrainState, params_sha256

DATASET, GLOBAL_BATCH, SEED = 64, 8, 1234


def build(strategy: str, accum: int, world: int, width: int = 32, zero: int = 2):
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(16, width), nn.GELU(), nn.Dropout(0.2), nn.Linear(width, 16))
    if strategy == "deepspeed":
        import deepspeed

        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.1 * s))
        cfg = {
            "train_micro_batch_size_per_gpu": GLOBAL_BATCH // (world * accum),
            "gradient_accumulation_steps": accum,
            "zero_optimization": {"stage": zero},
            "zero_force_ds_cpu_optimizer": False,
            "steps_per_print": 10**9,
        }
        engine, opt, _, sched = deepspeed.initialize(
            model=model, optimizer=opt, lr_scheduler=sched, config=cfg
        )
        return engine, None, None
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model[0])
        fully_shard(model[3])
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.1 * s))
    return model, opt, sched


def batch(epoch: int, offset: int, rank: int, world: int, n: int):
    """This rank's n samples of the global positions offset..: the same for any world size."""
    g = torch.Generator().manual_seed(SEED + epoch)
    xs = torch.randn(DATASET, 16, generator=g)
    perm = torch.randperm(DATASET, generator=g)
    idx = perm[offset + rank * n : offset + (rank + 1) * n]
    return xs[idx]


def hook(name: str, step: int, micro: int) -> bool:
    return os.environ.get(name) == f"{step}:{micro}"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--every", type=int, default=0)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--async-save", action="store_true")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--width", type=int, default=32, help="hidden width (bigger: save timings)")
    p.add_argument("--zero-stage", type=int, default=2)
    a = p.parse_args()
    if a.strategy == "deepspeed":
        import deepspeed

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no C++ build on CPU
        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(SEED * 1000 + rank)  # per-rank streams (restored from the checkpoint)
    random.seed(SEED + rank)
    np.random.seed(SEED + rank)
    model, opt, sched = build(a.strategy, a.accum, world, a.width, a.zero_stage)
    state = TrainState(
        model=model, optimizer=opt, scheduler=sched, data={"epoch": 0, "offset": 0}, config=vars(a)
    )
    ckpt = Checkpointer(
        a.run_dir, strategy=a.strategy, every_steps=a.every or None, async_save=a.async_save
    )
    stop = StopFlag().install()
    resumed = ckpt.load_latest(state)
    t_resumed = time.monotonic()
    if resumed is not None:
        digest = params_sha256(model)
        if rank == 0:
            (Path(a.run_dir) / f"resumed-{resumed}-world{world}.sha256").write_text(digest)
        if os.environ.get(jobenv.TEST_RESEED_AFTER_LOAD):  # negative control: lose the RNG
            torch.manual_seed(0)
    micro_n = GLOBAL_BATCH // (world * a.accum)
    log = Path(a.run_dir) / f"steps-rank{rank}.jsonl"
    while state.step < a.steps:
        for micro in range(a.accum):
            if rank == 0 and hook(jobenv.TEST_SIGNAL_AT, state.step, micro):
                os.kill(os.getpid(), signal.SIGUSR2)
            if rank == 0 and hook(jobenv.TEST_KILL_AT, state.step, micro):
                os.kill(os.getpid(), signal.SIGKILL)
            offset = state.data["offset"] + micro * world * micro_n
            x = batch(state.data["epoch"], offset, rank, world, micro_n)
            if a.strategy == "deepspeed":
                loss = (model(x) - x).pow(2).mean()
                model.backward(loss)
                model.step()
            else:
                sync = micro == a.accum - 1
                if a.strategy == "ddp" and not sync:
                    with model.no_sync():
                        ((model(x) - x).pow(2).mean() / a.accum).backward()
                else:
                    if a.strategy == "fsdp":
                        model.set_requires_gradient_sync(sync)
                    ((model(x) - x).pow(2).mean() / a.accum).backward()
        if a.strategy != "deepspeed":
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
        state.step += 1
        state.data["offset"] += GLOBAL_BATCH
        if state.data["offset"] + GLOBAL_BATCH > DATASET:
            state.epoch += 1
            state.data = {"epoch": state.data["epoch"] + 1, "offset": 0}
        with log.open("a") as f:
            f.write(
                json.dumps(
                    {
                        "step": state.step,
                        "resumed": resumed,
                        "t": time.monotonic(),
                        "since_resume": time.monotonic() - t_resumed,
                    }
                )
                + "\n"
            )
        if a.step_sleep:
            time.sleep(a.step_sleep)
        if stop.agreed("cpu", step=state.step):
            ckpt.save(state, sync=True)
            digest = params_sha256(model)
            if rank == 0:
                (Path(a.run_dir) / f"stopped-{state.step}.sha256").write_text(digest)
                (Path(a.run_dir) / "preempted.json").write_text(
                    json.dumps({"step": state.step, "reason": stop.reason})
                )
            teardown()
            return PREEMPTED_EXIT
        ckpt.maybe_save(state)
    ckpt.maybe_save(state, last=True)
    ckpt.wait()
    digest = params_sha256(model)
    if rank == 0:
        (Path(a.run_dir) / "final_params.sha256").write_text(digest + "\n")
        (Path(a.run_dir) / f"timings-{int(time.time_ns())}.json").write_text(
            json.dumps(ckpt.timings)
        )
    teardown()
    return 0


if __name__ == "__main__":
    from train_entry.dist import exit_now

    exit_now(main())
