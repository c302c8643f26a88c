"""A Lightning script under torchrun that survives preemption with exact resume (hpctrain.runtime).

    hpctrain submit --nodes 2 --gpus 1 --script examples/lightning_train.py --name pl-demo \
        --wait -- --steps 200
    hpctrain preempt pl-demo        # (while it runs) it saves, requeues and continues by itself
    hpctrain report pl-demo
    # without hpctrain:
    torchrun --standalone --nproc-per-node 2 examples/lightning_train.py --run-dir runs/pl-local

hpctrain launches one torchrun per node, so Lightning must use its TorchElastic environment (ranks
from torchrun), not its SLURM one (which reads the srun task's ids: one task per node here, so every
process would think it is rank 0 of its node). The Trainer is sized from torchrun's variables.
Lightning's own checkpointing is off: `runtime.Checkpoint` saves the model, the optimizer and the
step, which is also the data position (a sampler that starts at that step), so a requeued job ends
bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.environments import TorchElasticEnvironment
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

from hpctrain import runtime
from hpctrain.kernel import jobenv


class FromStep(Sampler[int]):
    """This rank's sample indices for steps start..total-1: step s, rank r reads a fixed slice."""

    def __init__(self, n: int, start: int, total: int, micro: int) -> None:
        self.n, self.start, self.total, self.micro = n, start, total, micro
        self.rank, self.world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))

    def __iter__(self) -> Iterator[int]:
        for step in range(self.start, self.total):
            first = (step * self.world + self.rank) * self.micro
            yield from ((first + i) % self.n for i in range(self.micro))

    def __len__(self) -> int:
        return (self.total - self.start) * self.micro


class Regressor(L.LightningModule):
    def __init__(self, resume: dict | None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 1))
        self.resume = resume
        if resume is not None:
            self.net.load_state_dict(resume["model"])

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.last_loss = loss.detach()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

    def on_train_start(self) -> None:
        if self.resume is not None:
            self.trainer.optimizers[0].load_state_dict(self.resume["optimizer"])


class Preemptible(L.Callback):
    """At every step boundary: metrics, periodic saves, and the stop flag agreed by all ranks."""

    def __init__(
        self,
        ckpt: runtime.Checkpoint,
        start: int,
        total: int,
        save_every: int,
        samples: int,
        sleep: float,
    ) -> None:
        self.ckpt, self.start, self.total = ckpt, start, total
        self.save_every, self.samples, self.sleep = save_every, samples, sleep
        self.preempted = False

    def state(self, trainer: L.Trainer, module: Regressor) -> dict:
        return {
            "model": module.net.state_dict(),
            "optimizer": trainer.optimizers[0].state_dict(),
            "step": self.step(trainer),
        }

    def step(self, trainer: L.Trainer) -> int:
        return self.start + trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, module: Regressor, *args: Any) -> None:
        step = self.step(trainer)
        runtime.log_metrics(
            step, total=self.total, loss=module.last_loss.item(), samples=self.samples
        )
        if self.sleep:
            time.sleep(self.sleep)
        if step % self.save_every == 0 and step < self.total:
            self.ckpt.save(step, self.state(trainer, module))
        if runtime.should_stop():  # every rank, every step: a collective
            self.ckpt.save(step, self.state(trainer, module))
            self.preempted = trainer.should_stop = True

    def on_train_end(self, trainer: L.Trainer, module: Regressor) -> None:
        if not self.preempted:  # the final checkpoint, as train_entry keeps one
            self.ckpt.save(self.step(trainer), self.state(trainer, module))


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
    p.add_argument("--run-dir", default=None, help="run folder when not under hpctrain")
    args = p.parse_args()

    run = runtime.run_dir(args.run_dir)
    world, local = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    gpu = torch.cuda.is_available() and jobenv.get(jobenv.DEVICE) != "cpu"
    trainer_args = dict(
        accelerator="gpu" if gpu else "cpu",
        devices=local,
        num_nodes=world // local,
        strategy="ddp",
        plugins=[TorchElasticEnvironment()],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )

    # The process group comes up inside fit(); the newest checkpoint is read before it, by every
    # rank alike (runtime.Checkpoint.load without a process group reads the same folder).
    ckpt = runtime.Checkpoint(run / "checkpoints")
    found = ckpt.load()
    start = found.step if found else 0
    module = Regressor(found.state if found else None)
    x = torch.randn(4096, 16, generator=torch.Generator().manual_seed(0))
    data = DataLoader(
        TensorDataset(x, torch.sin(x.sum(dim=1, keepdim=True))),
        batch_size=args.micro,
        sampler=FromStep(len(x), start, args.steps, args.micro),
    )
    stopper = Preemptible(ckpt, start, args.steps, args.save_every, args.micro * world, args.sleep)
    if int(os.environ.get("RANK", 0)) == 0:
        print(
            f"world {world}, restart {runtime.restart_count()}, step {start}/{args.steps}",
            flush=True,
        )
    trainer = L.Trainer(max_steps=args.steps - start, callbacks=[stopper], **trainer_args)
    if start < args.steps:
        trainer.fit(module, data)
    if stopper.preempted:
        if trainer.global_rank == 0:
            print(
                f"stopped at step {stopper.step(trainer)} ({runtime.stop_reason()}): exit 75",
                flush=True,
            )
        runtime.exit(runtime.PREEMPTED)
    if trainer.global_rank == 0:
        digest = runtime.params_sha256(module.net)
        (run / "final_params.sha256").write_text(digest + "\n")
        print(f"done: {args.steps} steps, final params sha256 {digest[:16]}...", flush=True)
    runtime.exit(0)


if __name__ == "__main__":
    main()
