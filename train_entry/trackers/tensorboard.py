"""TensorBoard: event files in <run>/tensorboard, one folder for the whole run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter


class TensorBoard:
    kind = "tensorboard"

    def open(
        self,
        run_dir: Path,
        *,
        name: str,
        config: Mapping[str, object],
        resume_id: str | None,
        step: int,
        project: str | None,
    ) -> str:
        # lazy: an optional extra (hpctrain[tensorboard]); torch's module imports the package
        from torch.utils.tensorboard import SummaryWriter

        folder = run_dir / "tensorboard"
        # purge_step: a restart that resumed at `step` hides the events written after it
        # (steps redone after a kill), so every step appears once.
        self.writer: SummaryWriter = SummaryWriter(
            str(folder), purge_step=step + 1 if step else None
        )
        return str(folder)

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(f"train/{key}", value, step)

    def close(self) -> None:
        self.writer.close()
