"""MLflow: one MLflow run per hpctrain run, at $MLFLOW_TRACKING_URI or in <run>/mlruns."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


class MLflow:
    kind = "mlflow"

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
        import mlflow  # lazy: an optional extra (hpctrain[mlflow])

        if not os.environ.get("MLFLOW_TRACKING_URI"):
            # No server named: MLflow's file store inside the run folder (MLflow 3 keeps it behind
            # an opt-in; `mlflow ui --backend-store-uri <run>/mlruns` shows it).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            mlflow.set_tracking_uri((run_dir / "mlruns").absolute().as_uri())
        if resume_id:
            self.run = mlflow.start_run(run_id=resume_id)
        else:
            mlflow.set_experiment(project or "hpctrain")
            self.run = mlflow.start_run(run_name=name)
            flat = _flatten(config)
            for i in range(0, len(flat), 100):  # MLflow takes at most 100 params per call
                mlflow.log_params(dict(list(flat.items())[i : i + 100]))
        self.mlflow = mlflow
        return str(self.run.info.run_id)

    def log(self, step: int, values: dict[str, float]) -> None:
        self.mlflow.log_metrics(values, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def _flatten(d: Mapping[str, object], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = str(v)[:500]
    return out
