"""Experiment trackers for train_entry (`--train.tracker=tensorboard|mlflow|wandb`).

One tracker run per hpctrain run: its id is kept in <run>/tracker.json, so a requeue or a
`hpctrain resume` continues the same tracker run instead of starting a new one. Each tracker is one
module with a class (open / log / close) and one line in TRACKERS; the package it needs is an
optional extra (`pip install 'hpctrain[mlflow]'`), imported only when that tracker is chosen.
Only rank 0 tracks.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from hpctrain.kernel import layout
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.rundir import RunFolder

# name -> (module:class, the extra that installs its package)
TRACKERS: dict[str, tuple[str, str]] = {
    "tensorboard": ("train_entry.trackers.tensorboard:TensorBoard", "tensorboard"),
    "mlflow": ("train_entry.trackers.mlflow:MLflow", "mlflow"),
    "wandb": ("train_entry.trackers.wandb:WandB", "wandb"),
}
ID_FILE = layout.TRACKER


class Tracker(Protocol):
    kind: str

    def open(
        self,
        run_dir: Path,
        *,
        name: str,
        config: Mapping[str, object],
        resume_id: str | None,
        step: int,
        project: str | None,
    ) -> str: ...  # returns the tracker run's id

    def log(self, step: int, values: dict[str, float]) -> None: ...

    def close(self) -> None: ...


PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow", "wandb": "wandb"}


def check_installed(kind: str) -> None:
    """Fail before training (and at submit) when the tracker's package is missing."""
    if kind != "none" and importlib.util.find_spec(PACKAGES[kind]) is None:
        raise UserError(
            f"train.tracker={kind}: {PACKAGES[kind]} is not installed: "
            f"pip install 'hpctrain[{TRACKERS[kind][1]}]'"
        )


def open_tracker(
    kind: str,
    run_dir: Path,
    *,
    config: Mapping[str, object],
    step: int,
    project: str | None = None,
) -> Tracker:
    """Open (or continue) the run's tracker run; its id goes into <run>/tracker.json."""
    if kind not in TRACKERS:
        raise UserError(f"train.tracker={kind!r}: use one of none, {', '.join(TRACKERS)}")
    target, extra = TRACKERS[kind]
    module, cls = target.split(":")
    try:
        tracker: Tracker = getattr(importlib.import_module(module), cls)()
    except ImportError as e:
        raise UserError(
            f"train.tracker={kind}: {e.name or kind} is not installed: "
            f"pip install 'hpctrain[{extra}]'"
        ) from None
    path = Path(run_dir) / ID_FILE
    saved = _read(path)
    kept = saved.get("id") if saved.get("kind") == kind else None
    resume_id = kept if isinstance(kept, str) else None  # the id a tracker gave (a string)
    run_id = tracker.open(
        Path(run_dir),
        name=Path(run_dir).name,
        config=config,
        resume_id=resume_id,
        step=step,
        project=project,
    )
    if run_id != resume_id:
        record = {"kind": kind, "id": run_id, "project": project}
        RunFolder(run_dir).write(ID_FILE, json.dumps(record) + "\n", durable=False)
    return tracker


def _read(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
