"""The one place the baselines get their model, data, batch and optimizer: from train_entry itself.

Both sides of a training benchmark read the same dotted overrides (the harness passes them to
train_entry as flags and to the baselines in $BENCH_TRAIN_ARGS), resolve them with train_entry's
own config loader and build the demo GPT and its data with train_entry's own factories, so the
only difference measured is the loop around them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch.utils.data import Dataset, DistributedSampler

if TYPE_CHECKING:
    from train_entry.config import TrainConfig

Batch = dict[str, torch.Tensor]  # the demo data's sample and batch: {"idx": ..., "targets": ...}


def overrides() -> list[str]:
    args: list[str] = json.loads(os.environ.get("BENCH_TRAIN_ARGS", "[]"))
    return args


def no_deepspeed_builds() -> None:
    """DeepSpeed would compile its shared-memory comm op at init (~30 s, needs a compiler); a plain
    CPU user turns it off the same way train_entry does (see shared notes)."""
    import deepspeed.ops

    vars(deepspeed.ops).setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False


@dataclass
class Demo:
    cfg: TrainConfig  # train_entry's resolved config
    model: torch.nn.Module  # unwrapped, seeded as train_entry seeds it
    dataset: Dataset[Batch]
    collate: Callable[[list[Batch]], Batch] | None
    micro_batch: int
    accum: int
    seed: int
    clip: float | None

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        from train_entry.model import compute_loss  # the protocol: model(**batch) returns the loss

        return compute_loss(model, batch)

    def optimizer(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        from train_entry.optim import build_optimizer  # the very same optimizer construction

        return build_optimizer(params, self.cfg)

    def scheduler(self, opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        from train_entry.optim import build_scheduler  # the very same warmup + decay

        return build_scheduler(opt, self.cfg)

    def blocks(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The transformer blocks FSDP2 shards one by one (the FSDP2 tutorial's `model.layers`)."""
        from train_entry.model import find_blocks

        return find_blocks(model, self.cfg.fsdp.block_class)

    def deepspeed_config(self) -> dict[str, object]:
        """DeepSpeed's getting-started config for the same batch, stage and clipping."""
        t, ds = self.cfg.train, self.cfg.deepspeed
        world = int(os.environ.get("WORLD_SIZE", "1"))
        conf: dict[str, object] = {
            "train_batch_size": t.micro_batch * self.accum * world,
            "train_micro_batch_size_per_gpu": t.micro_batch,
            "gradient_accumulation_steps": self.accum,
            "zero_optimization": {"stage": ds.zero_stage},
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,  # torch AdamW, as on train_entry's side
            "steps_per_print": 10**9,
        }
        if t.clip_grad_norm:
            conf["gradient_clipping"] = t.clip_grad_norm
        if t.precision == "bf16":
            conf["bf16"] = {"enabled": True}
        return conf


def build() -> Demo:
    """The demo model and data exactly as train_entry builds them for the same overrides."""
    from train_entry import data as te_data
    from train_entry import model as te_model
    from train_entry.config import check_sizes, load_config

    cfg = load_config(None, overrides())
    accum = check_sizes(cfg)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    model = te_model.build_model(cfg, rank=rank, world_size=world)  # seeds as train_entry does
    # train_entry's demo Progressions: map-style, {"idx", "targets"} per sample
    dataset = cast("Dataset[Batch]", te_data.build_dataset(cfg, rank=rank, world_size=world))
    collate = None  # torch's default_collate, as train_entry's default
    return Demo(
        cfg=cfg,
        model=model,
        dataset=dataset,
        collate=collate,
        micro_batch=cfg.train.micro_batch,
        accum=accum,
        seed=cfg.train.seed,
        clip=cfg.train.clip_grad_norm,
    )


def forever(
    loader: Iterable[Batch], sampler: DistributedSampler[Batch] | None = None
) -> Iterator[Batch]:
    """Batches over epochs, calling sampler.set_epoch as the guides do."""
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1
