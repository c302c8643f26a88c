"""Hugging Face `Trainer` under hpctrain, with one line: `callbacks=[HpctrainCallback()]`.

    from hpctrain.integrations.hf import HpctrainCallback
    from transformers.trainer_utils import get_last_checkpoint

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[HpctrainCallback()])
    trainer.train(resume_from_checkpoint=get_last_checkpoint(args.output_dir))

At each optimizer step's end it votes on `runtime.should_stop()` (the STOP file or a signal: a
preemption, the time-limit warning, `hpctrain preempt`), agreed by all ranks without holding the
step: the vote is an async all-reduce read one step later. On a stop, Trainer saves its full
checkpoint at that step (`checkpoint-<step>`: model, optimizer, scheduler, every rank's RNG state,
trainer_state.json with the step, so the data position), then every rank leaves with
`runtime.PREEMPTED` (75) and the batch shell requeues the job; the restarted script resumes from
that checkpoint through `get_last_checkpoint`, redoing no step. Trainer's logs (loss, learning rate,
grad norm) and a step count at most once a second go to `runtime.log_metrics`, so `submit --wait`,
`status` and `report` show step/total, loss and speed.

Without this line (no change to the script) hpctrain still ends a run that finished COMPLETED, and
`status` reads progress from Trainer's own files; see examples/README.md for what each way covers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as e:  # one clear line, not a traceback from deep inside an import
    raise ImportError(
        "hpctrain.integrations.hf needs transformers: pip install 'hpctrain[hf]'"
    ) from e

from hpctrain import runtime

# Trainer's log keys -> the names metrics.jsonl uses (what status and report read)
RENAME = {"learning_rate": "lr"}
SKIP = {"epoch", "total_flos"}


class HpctrainCallback(TrainerCallback):
    """Stop at a step boundary with a full Trainer checkpoint and exit 75; forward the logs.

    every_s: how often (seconds) a step without a Trainer log still writes a progress line.
    """

    def __init__(self, *, every_s: float = 1.0) -> None:
        self.every_s = every_s
        self.stopping: int | None = None  # the step a stop was agreed at
        self._last_line = 0.0
        self._step = -1  # the newest step written to metrics.jsonl
        # progress lines only under hpctrain: a plain torchrun run writes nothing of ours
        self._logging = bool(os.environ.get(runtime.ENV_RUN_DIR))

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: object,
    ) -> None:
        runtime.install()  # the signal handlers, in the main thread, before the first step

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: object,
    ) -> None:
        # the vote started one step ago: every rank reads the same answer at the same step
        if runtime.should_stop(wait=False) and state.global_step < state.max_steps:
            self.stopping = state.global_step  # (at the last step the run is simply done)
            control.should_save = True
            control.should_training_stop = True
        # a step count at most every `every_s`, unless Trainer logs this step (on_log writes it)
        if time.monotonic() - self._last_line >= self.every_s and not control.should_log:
            self._line(args, state)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Mapping[str, object] | None = None,
        **kwargs: object,
    ) -> None:
        if logs:
            self._line(args, state, logs)

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: object,
    ) -> None:
        if self.stopping is None or state.global_step != self.stopping:
            return
        # every rank has written its part of checkpoint-<step> (rank 0 the model, optimizer and
        # trainer_state.json, each rank its RNG file) before any leaves: torchrun stops the
        # others as soon as one rank exits non-zero
        runtime.barrier()
        self._line(args, state)  # the step the run stopped at (`report` counts no step redone)
        runtime.exit(runtime.PREEMPTED, step=state.global_step)

    def _line(
        self,
        args: TrainingArguments,
        state: TrainerState,
        logs: Mapping[str, object] | None = None,
    ) -> None:
        """One metrics.jsonl line per step at most (`report` reads a repeated step as a restart):
        rank 0, under hpctrain only."""
        if not self._logging or not state.is_world_process_zero:
            return
        if state.global_step <= self._step:  # e.g. Trainer's summary after its last step's log
            return
        values = {
            RENAME.get(k, k): float(v)
            for k, v in (logs or {}).items()
            if k not in SKIP and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        self._step, self._last_line = state.global_step, time.monotonic()
        runtime.log_metrics(
            state.global_step, total=state.max_steps, samples=_samples(args), **values
        )


def _samples(args: TrainingArguments) -> int:
    """Samples per optimizer step, over all ranks."""
    world = int(getattr(args, "world_size", 1) or 1)
    return int(args.per_device_train_batch_size * args.gradient_accumulation_steps * world)
