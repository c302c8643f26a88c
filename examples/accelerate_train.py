"""A Hugging Face Accelerate script that survives preemption with exact resume (hpctrain.runtime).

    hpctrain submit --nodes 2 --gpus 1 --script examples/accelerate_train.py --name acc-demo \
        --wait -- --steps 200
    hpctrain preempt acc-demo       # (while it runs) it saves, requeues and continues by itself
    hpctrain report acc-demo
    # without hpctrain:
    torchrun --standalone --nproc-per-node 2 examples/accelerate_train.py --run-dir runs/acc-local

The node environment hpctrain sets is what Accelerate expects under torchrun (RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR/PORT from torchrun; ACCELERATE_USE_CPU=1 on CPU nodes), so
`Accelerator()` needs no arguments and sees the whole job. The data goes through Accelerate's own
prepared DataLoader; a resumed job skips the batches already seen with `skip_first_batches`.
"""

from __future__ import annotations

import argparse
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hpctrain import runtime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--steps", type=int, default=100, help="optimizer steps in total (across restarts)"
    )
    p.add_argument("--micro", type=int, default=8, help="samples per process per step")
    p.add_argument("--save-every", type=int, default=20, help="periodic checkpoint every N steps")
    p.add_argument(
        "--sleep", type=float, default=0.0, help="seconds to pause per step (demos/tests)"
    )
    p.add_argument("--run-dir", default=None, help="run folder when not under hpctrain")
    args = p.parse_args()

    accelerator = Accelerator()
    run = runtime.run_dir(args.run_dir)
    torch.manual_seed(0)
    x = torch.randn(4096, 16, generator=torch.Generator().manual_seed(0))
    data = DataLoader(
        TensorDataset(x, torch.sin(x.sum(dim=1, keepdim=True))),
        batch_size=args.micro,
        shuffle=False,
    )
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, data = accelerator.prepare(model, opt, data)

    ckpt = runtime.Checkpoint(run / "checkpoints")
    step, epoch = 0, 0
    found = ckpt.load()
    if found is not None:
        accelerator.unwrap_model(model).load_state_dict(found.state["model"])
        opt.load_state_dict(found.state["optimizer"])
        step, epoch = found.state["step"], found.state["epoch"]
    accelerator.print(
        f"world {accelerator.num_processes}, restart {runtime.restart_count()}, "
        f"device {accelerator.device}, step {step}/{args.steps}"
    )

    def state() -> dict[str, object]:
        return {
            "model": accelerator.unwrap_model(model).state_dict(),
            "optimizer": opt.state_dict(),
            "step": step,
            "epoch": epoch,
        }

    while step < args.steps:
        per_epoch = len(data)
        batches = (
            accelerator.skip_first_batches(data, step - epoch * per_epoch)
            if step > epoch * per_epoch
            else data
        )
        for xb, yb in batches:
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            opt.step()
            step += 1
            runtime.log_metrics(
                step,
                total=args.steps,
                loss=loss.item(),
                samples=args.micro * accelerator.num_processes,
            )
            if args.sleep:
                time.sleep(args.sleep)
            if step % per_epoch == 0:
                epoch += 1
            if step % args.save_every == 0 and step < args.steps:
                ckpt.save(step, state())
            if runtime.should_stop():  # every process, every step: a collective
                ckpt.save(step, state())
                accelerator.print(
                    f"stopped at step {step} ({runtime.stop_reason()}): saved, exit 75"
                )
                runtime.exit(runtime.PREEMPTED)
            if step >= args.steps:
                break

    ckpt.save(step, state())
    if accelerator.is_main_process:
        digest = runtime.params_sha256(accelerator.unwrap_model(model))
        (run / "final_params.sha256").write_text(digest + "\n")
        print(f"done: {step} steps, final params sha256 {digest[:16]}...", flush=True)
    runtime.exit(0)


if __name__ == "__main__":
    main()
