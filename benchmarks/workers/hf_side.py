"""One side of the Hugging Face Trainer benchmark (benchmarks/hf_trainer.py): examples/hf_trainer.py's
model and data at a measuring size, Trainer under torchrun, and one completion time per optimizer
step on rank 0 in $BENCH_PROGRESS (the same small callback on both sides). --hpctrain adds the one
line under test, `callbacks=[HpctrainCallback()]`, with the job environment of an hpctrain run
(the run folder and stop file variables, set by the harness), so it votes on the stop flag at every
step and writes metrics.jsonl lines as it would in a job. No checkpoint is saved while measured.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from examples.hf_trainer import Synthetic  # noqa: E402


class Progress(TrainerCallback):
    def __init__(self, path: str) -> None:
        self.f = open(path, "a", buffering=1)  # noqa: SIM115 - open for the whole run

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: object,
    ) -> None:
        if state.is_world_process_zero:
            self.f.write(f"{time.time()}\n")


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=256, n_positions=32, n_embd=256, n_layer=4, n_head=4)
    )
    args = TrainingArguments(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        save_strategy="no",
        logging_steps=10,
        report_to="none",
        disable_tqdm=True,
        seed=0,
        use_cpu=not torch.cuda.is_available(),
        ddp_find_unused_parameters=False,
    )
    callbacks: list[TrainerCallback] = [Progress(os.environ["BENCH_PROGRESS"])]
    if "--hpctrain" in sys.argv:
        from hpctrain.integrations.hf import HpctrainCallback

        callbacks.append(HpctrainCallback())
    Trainer(model=model, args=args, train_dataset=Synthetic(10**7), callbacks=callbacks).train()


if __name__ == "__main__":
    main()
