"""The Hugging Face Trainer benchmark's worker (benchmarks/hf_trainer.py): examples/hf_trainer.py's
model and data at a measuring size, Trainer under torchrun, one completion time per optimizer step
on rank 0 in $BENCH_PROGRESS, and the one line under test, `callbacks=[HpctrainCallback()]`, with
the job environment of an hpctrain run (the run folder and stop file variables, set by the
harness), so it votes on the stop flag at every step and writes metrics.jsonl lines as it would in
a job. No checkpoint is saved while measured.

    torchrun --nproc-per-node 2 benchmarks/workers/hf_side.py OUT STEPS WARMUP SEGMENT

The callback is on and off in alternating segments of the same processes (two launches of one
configuration run up to 5% apart for their whole lives here: benchmarks/workers/paired.py): after
WARMUP steps, segment j (SEGMENT steps, from 0) is "on" when hf_trainer.on(j): an ABBA order, so a
drift of the load and the position in a pair land on both sides alike. In an "off" segment the
callback's events return at once: no vote, no line.
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
from benchmarks.hf_trainer import on  # noqa: E402
from examples.hf_trainer import Synthetic  # noqa: E402
from hpctrain.integrations.hf import HpctrainCallback  # noqa: E402


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


class Toggled(HpctrainCallback):
    """HpctrainCallback in the "on" segments only (every rank decides by the step: the same)."""

    def __init__(self, warmup: int, segment: int) -> None:
        super().__init__()
        self.warmup, self.segment = warmup, segment

    def _on(self, state: TrainerState) -> bool:
        step = state.global_step - 1  # the step just done, from 0
        return step < self.warmup or on((step - self.warmup) // self.segment)

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if self._on(state):
            super().on_step_end(args, state, control, **kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        if self._on(state):
            super().on_log(args, state, control, logs, **kwargs)


def main() -> None:
    out, steps, warmup, segment = sys.argv[1], *map(int, sys.argv[2:5])
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
    # Progress last: a step's completion time includes the callback's work at its end
    callbacks = [Toggled(warmup, segment), Progress(os.environ["BENCH_PROGRESS"])]
    Trainer(model=model, args=args, train_dataset=Synthetic(10**7), callbacks=callbacks).train()


if __name__ == "__main__":
    main()
