"""Parallel dimensions beyond data parallel, on one DeviceMesh ("pp", "dp", "tp"; torchtitan's
ParallelDims is the model): tensor parallel (tp.py), pipeline parallel (pp.py), the mesh (dims.py),
the demo GPT's plan and split (gpt.py). The strategy that drives them, with FSDP2 as the
data-parallel dimension, is a strategy like the others: train_entry/strategies/mesh.py.

The order is fixed and commented there: split into pipeline stages, then per stage the TP
plan, activation checkpointing, compile, and FSDP2 over the dp dimension. A new dimension is a module
here and a line in DIMENSIONS (what it is, the module that applies it); its size and validation are a
key of the `parallel` config section and a check in hpctrain/kernel/mesh.py.
"""

from __future__ import annotations

DIMENSIONS: dict[str, str] = {  # mesh dimension -> the module that applies it
    "pp": "train_entry.parallel.pp",
    "tp": "train_entry.parallel.tp",
    # dp: the data-parallel strategy (FSDP2 over mesh["dp"]), train_entry/strategies/fsdp.py
}
