"""Weights & Biases: one W&B run per hpctrain run (resume="allow" with the kept id); files under
<run>/wandb. WANDB_MODE=offline works without a network (`wandb sync` uploads later)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any


class WandB:
    kind = "wandb"

    def open(
        self,
        run_dir: Path,
        *,
        name: str,
        config: dict[str, Any],
        resume_id: str | None,
        step: int,
        project: str | None,
    ) -> str:
        import wandb

        run_id = resume_id or uuid.uuid4().hex[:8]  # W&B ids: lowercase letters and digits
        self.run: Any = wandb.init(  # Any: the tracker's client object (third-party)
            project=project or "hpctrain",
            name=name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=config,
        )
        return run_id

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()
