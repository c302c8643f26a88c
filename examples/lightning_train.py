"""A Lightning script under torchrun that survives preemption with exact resume: one line,
`callbacks=[HpctrainCheckpoint()]`, and `trainer.fit(..., ckpt_path="last")`.

    hpctrain submit --nodes 2 --gpus 1 --script examples/lightning_train.py --name pl-demo \
        --wait -- --steps 200
    hpctrain preempt pl-demo        # (while it runs) last.ckpt at that step, exit 75, requeue, resume
    hpctrain report pl-demo
    # without hpctrain:
    torchrun --standalone --nproc-per-node 2 examples/lightning_train.py --run-dir runs/pl-local

hpctrain launches one torchrun per node, so Lightning must use its TorchElastic environment (ranks
from torchrun), not its SLURM one (which reads the srun task's ids: one task per node here, so every
process would think it is rank 0 of its node). The Trainer is sized from torchrun's variables.

Everything else is a plain Lightning script: a shuffled DataLoader (Lightning adds its
DistributedSampler), dropout, several epochs. `HpctrainCheckpoint` is Lightning's ModelCheckpoint
plus the stop flag: at a stop it saves `<run>/checkpoints/last.ckpt` (model, optimizer, the loops'
progress, every rank's RNG), exits 75, and the requeued start's `ckpt_path="last"` resumes there:
the same batches, the same dropout masks, so it ends bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import lightning as L
import torch
from lightning.pytorch.plugins.environments import TorchElasticEnvironment
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hpctrain import runtime
from hpctrain.integrations.lightning import HpctrainCheckpoint
from hpctrain.kernel import jobenv


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class Slow(L.Callback):
    """--sleep: pause after each step, so a demo's (or a test's) preemption lands mid-run."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args: object) -> None:
        time.sleep(self.seconds)


def main(argv: Sequence[str] | None = None, extra: Sequence[L.Callback] = ()) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100, help="optimizer steps in total")
    p.add_argument("--micro", type=int, default=8, help="samples per rank per step")
    p.add_argument("--samples", type=int, default=256, help="samples per epoch (all ranks)")
    p.add_argument("--save-every", type=int, default=20, help="periodic checkpoint every N steps")
    p.add_argument(
        "--sleep", type=float, default=0.0, help="seconds to pause per step (demos/tests)"
    )
    p.add_argument("--run-dir", default=None, help="run folder when not under hpctrain")
    args = p.parse_args(argv)

    run = runtime.run_dir(args.run_dir)
    world, local = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    gpu = torch.cuda.is_available() and jobenv.get(jobenv.DEVICE) != "cpu"
    x = torch.randn(args.samples, 16, generator=torch.Generator().manual_seed(0))
    data = DataLoader(
        TensorDataset(x, torch.sin(x.sum(dim=1, keepdim=True))),
        batch_size=args.micro,
        shuffle=True,  # Lightning replaces the sampler by a DistributedSampler (seed 0, per epoch)
    )
    # the one line; every_s=0: a metrics line per step (the default writes one a second)
    checkpoint = HpctrainCheckpoint(
        dirpath=run / "checkpoints", every_n_train_steps=args.save_every, every_s=0
    )
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator="gpu" if gpu else "cpu",
        devices=local,
        num_nodes=world // local,
        strategy="ddp",
        plugins=[TorchElasticEnvironment()],
        callbacks=[checkpoint, *([Slow(args.sleep)] if args.sleep else []), *extra],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = Regressor()
    if trainer.global_rank == 0:
        print(f"world {world}, restart {runtime.restart_count()}", flush=True)
    trainer.fit(module, data, ckpt_path="last")  # the first start finds none: from step 0
    if trainer.global_rank == 0:
        digest = runtime.params_sha256(module.net)
        (run / "final_params.sha256").write_text(digest + "\n")
        print(
            f"done: {trainer.global_step} steps, final params sha256 {digest[:16]}...", flush=True
        )
    runtime.exit(0)


if __name__ == "__main__":
    main()
