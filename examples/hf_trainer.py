"""Hugging Face Trainer under hpctrain: one line (`callbacks=[HpctrainCallback()]`) for a save at
the step of a preemption, exit 75, requeue and a resume that redoes no step; `--plain` runs the same
script without that line, as an unchanged script (it then trains through a stop request to its end).

    hpctrain submit --nodes 2 --gpus 2 --script examples/hf_trainer.py --name hf-demo \
        --wait -- runs/hf-out --steps 200
    hpctrain preempt hf-demo      # (while it runs) checkpoint-<step>, exit 75, requeue, resume
    hpctrain report hf-demo
    # without hpctrain (CPU):
    torchrun --standalone --nproc-per-node 2 examples/hf_trainer.py runs/hf-local --steps 50

A tiny GPT-2 built from a config (nothing downloaded) on a synthetic dataset whose sample i is a
pure function of i; Trainer's own resume (`get_last_checkpoint`) restores model, optimizer,
scheduler, every rank's RNG and the data position from `checkpoint-<step>/`. Keep Trainer's default
`ddp_find_unused_parameters` (True here): with False, DDP rebuilds its gradient buckets after the
first step of every start, so on 3 or more ranks a resumed run sums gradients in another order than
an uninterrupted one and ends different in the last bits (measured on 2 x 2: losses equal to 6
digits, weights not bit-identical).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

VOCAB, SEQ = 256, 32


class Synthetic(Dataset[dict[str, torch.Tensor]]):
    """Sample i: a short sequence from a generator seeded with i (the same on every rank)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        start = torch.randint(0, VOCAB, (1,), generator=g)
        ids = (start + torch.arange(SEQ) * torch.randint(1, 4, (1,), generator=g)) % VOCAB
        return {"input_ids": ids, "labels": ids.clone()}


class Slow(TrainerCallback):
    """--sleep: pause after each step, so a demo's (or a test's) preemption lands mid-run."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, *args: object, **kwargs: object) -> None:
        time.sleep(self.seconds)


def params_sha256(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("output_dir", help="Trainer's output_dir (its checkpoint-<step> folders)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps in total")
    p.add_argument("--save-steps", type=int, default=50, help="Trainer's periodic checkpoints")
    p.add_argument("--sleep", type=float, default=0.0, help="seconds to pause per step")
    p.add_argument("--plain", action="store_true", help="without hpctrain's line (unchanged)")
    a = p.parse_args()

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=2)
    )
    args = TrainingArguments(
        output_dir=a.output_dir,
        max_steps=a.steps,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        save_steps=a.save_steps,
        logging_steps=5,
        report_to="none",
        seed=0,
        use_cpu=not torch.cuda.is_available(),
    )
    callbacks: list[TrainerCallback] = [Slow(a.sleep)] if a.sleep else []
    if not a.plain:
        from hpctrain.integrations.hf import HpctrainCallback  # the one line

        callbacks.append(HpctrainCallback())
    trainer = Trainer(model=model, args=args, train_dataset=Synthetic(50_000), callbacks=callbacks)
    last = get_last_checkpoint(a.output_dir) if os.path.isdir(a.output_dir) else None
    if last and trainer.is_world_process_zero():
        print(f"resuming from {last}", flush=True)
    trainer.train(resume_from_checkpoint=last)
    if trainer.is_world_process_zero():
        assert trainer.model is not None  # the model passed in above
        digest = params_sha256(trainer.model)
        with open(os.path.join(a.output_dir, "final_params.sha256"), "w") as f:
            f.write(digest + "\n")
        print(f"done: {trainer.state.global_step} steps, final params sha256 {digest[:16]}...")


if __name__ == "__main__":
    main()
