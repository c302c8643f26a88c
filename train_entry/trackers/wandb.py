"""Weights & Biases: one W&B run per hpctrain run (resume="allow" with the kept id); files under
<run>/wandb. WANDB_MODE=offline works without a network (`wandb sync` uploads later)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wandb import Run


class WandB:
    kind = "wandb"

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
        import wandb  # lazy: an optional extra (hpctrain[wandb])

        run_id = resume_id or uuid.uuid4().hex[:8]  # W&B ids: lowercase letters and digits
        self.run: Run = wandb.init(
            project=project or "hpctrain",
            name=name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=dict(config),
        )
        return run_id

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()
