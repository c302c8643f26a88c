"""examples/lightning_train.py with a stop request at a chosen step (tests/test_lightning_callback.py):
rank 0 creates the job's STOP file (what `hpctrain preempt` does) once step --stop-at has ended.

    torchrun --standalone --nproc-per-node 2 tests/scripts/lightning_stop_at.py --stop-at 20 \
        --run-dir RUN --steps 40
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import lightning as L

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from lightning_train import main  # noqa: E402

from hpctrain.kernel import jobenv  # noqa: E402


class StopAt(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step and trainer.global_rank == 0:
            Path(os.environ[jobenv.STOP_FILE]).touch()


if __name__ == "__main__":
    argv = sys.argv[1:]
    at = None
    if "--stop-at" in argv:
        i = argv.index("--stop-at")
        at = int(argv[i + 1])
        del argv[i : i + 2]
    main(argv, [StopAt(at)] if at is not None else [])
