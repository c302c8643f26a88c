"""Helpers shared by tests/test_bad_nodes.py and tests/test_bad_nodes_live.py."""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.kernel import jobenv

REPO = Path(__file__).resolve().parents[1]

STATE = Path(os.environ.get(jobenv.SLURM_STATE) or REPO / "tests" / "slurm" / ".state")

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}

TRAIN = [
    "--train.micro_batch=4",
    "--train.global_batch=8",
    "--train.log_every=1",
    "--model.d_model=64",
    "--model.n_layers=2",
    "--model.seq_len=32",
]
