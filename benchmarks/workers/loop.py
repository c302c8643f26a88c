"""The pieces of train_entry a worker needs, put together the way train_entry's trainer does."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from train_entry.config import TrainConfig
    from train_entry.data import Batches
    from train_entry.dist import DistInfo
    from train_entry.state import TrainState
    from train_entry.strategies.base import Strategy


@dataclass
class Job:
    cfg: TrainConfig
    info: DistInfo
    w: Strategy
    state: TrainState
    batches: Batches
    accum: int

    def train(self, steps: int) -> None:
        from train_entry.model import compute_loss

        for _ in range(steps):
            for i in range(self.accum):
                with self.w.sync(i == self.accum - 1), self.w.autocast():
                    loss = compute_loss(self.w.model, next(self.batches))
                    self.w.backward(loss)
            self.w.step()
            self.state.step += 1
            self.state.data = self.batches.position


def job() -> Job:
    from train_entry.config import check_sizes, load_config
    from train_entry.data import build_batches
    from train_entry.dist import init_distributed
    from train_entry.model import build_model
    from train_entry.state import TrainState
    from train_entry.strategies import wrap

    cfg = load_config(None, json.loads(os.environ.get("BENCH_TRAIN_ARGS", "[]")))
    accum = check_sizes(cfg)
    info = init_distributed(timeout_min=cfg.train.timeout_min, seed=cfg.train.seed)
    model = build_model(cfg, rank=info.rank, world_size=info.world_size)
    w = wrap(model, cfg=cfg, device=info.device, grad_accum=accum)
    batches = build_batches(cfg, rank=info.rank, world_size=info.world_size)
    state = TrainState(
        model=w.model,
        optimizer=w.optimizer,
        scheduler=w.scheduler,
        scaler=w.scaler,
        config=cfg.model_dump(mode="json"),
    )
    return Job(cfg, info, w, state, batches, accum)
