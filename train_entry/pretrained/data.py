"""Batches for an hf: model: transformers' keys (`input_ids`, `labels`), so `model(**batch)`
returns its own `.loss` and a pipeline's loss (layout.causal_lm_loss) sees the same labels.

The demo task's samples ({"idx", "targets"}, targets already shifted by one) become
{"input_ids": idx, "labels": targets shifted back} (its first label is ignored, as transformers
ignores it anyway); a dataset already giving input_ids passes through unchanged. The config names
this function as data.collate for an hf: model run on the demo task (config/load.py HF_COLLATE).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import default_collate


def collate(items: Sequence[object]) -> object:
    batch = default_collate(list(items))
    if isinstance(batch, dict) and "idx" in batch and "targets" in batch:
        idx, targets = batch["idx"], batch["targets"]
        labels = torch.full_like(idx, -100)
        labels[:, 1:] = targets[:, :-1]
        return {"input_ids": idx, "labels": labels}
    if isinstance(batch, dict) and "input_ids" in batch and "labels" not in batch:
        return {**batch, "labels": batch["input_ids"]}
    return batch
