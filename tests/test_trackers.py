"""train.tracker: one tracker run per hpctrain run, continued across a preemption and restart.

Each tracker for real, offline: TensorBoard event files, MLflow's file store, W&B offline mode.
train_entry runs 4 steps as one process, stopped after step 2 (exit 75) and started again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.kernel import jobenv

pytestmark = [pytest.mark.slow]


TRACKERS = ("tensorboard", "mlflow", "wandb")


def train_all(root: Path, env: dict[str, str] | None = None) -> None:
    """train_entry for every tracker at once (one process each: most of it is start-up)."""
    env = env or {}
    procs = {
        t: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "train_entry",
                "--run-dir",
                str(root / t),
                "--max-steps",
                "4",
                f"--train.tracker={t}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "WANDB_MODE": "offline",
                "WANDB_SILENT": "true",
                "MLFLOW_TRACKING_URI": "",
                **env,
            },
        )
        for t in TRACKERS
    }
    for t, proc in procs.items():
        err = proc.communicate(timeout=240)[1]
        assert proc.returncode == (75 if jobenv.STOP_AT_STEP in env else 0), (t, err[-3000:])


def test_one_tracker_run_across_a_restart(tmp_path):
    train_all(tmp_path, {jobenv.STOP_AT_STEP: "2"})
    first = {t: json.loads((tmp_path / t / "tracker.json").read_text()) for t in TRACKERS}
    train_all(tmp_path)
    for tracker in TRACKERS:
        run = tmp_path / tracker
        kept = json.loads((run / "tracker.json").read_text())
        assert kept == first[tracker] and kept["kind"] == tracker, (first, kept)
        _check(tracker, run, kept)


def _check(tracker: str, run: Path, kept: dict) -> None:
    if tracker == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(kept["id"])
        acc.Reload()
        assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3, 4]
    elif tracker == "mlflow":
        from mlflow.tracking import MlflowClient

        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        client = MlflowClient(tracking_uri=(run / "mlruns").as_uri())
        found = [
            r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])
        ]
        assert [r.info.run_id for r in found] == [kept["id"]]  # one run, not two
        assert [m.step for m in client.get_metric_history(kept["id"], "loss")] == [1, 2, 3, 4]
        assert found[0].data.params["train.max_steps"] == "4"
    else:
        starts = sorted((run / "wandb").glob("offline-run-*"))
        assert len(starts) == 2 and all(p.name.endswith("-" + kept["id"]) for p in starts), starts
        for p in starts:
            assert (p / f"run-{kept['id']}.wandb").stat().st_size > 0
