"""The demo task, user datasets, a batch stream with an exact, restorable position, and a batch's
way to the device.

Position (saved in every checkpoint, world-size independent): {"epoch": e, "offset": g} where g is the
number of samples the whole job consumed in epoch e. Map-style data goes through
DistributedSampler(seed, drop_last) + set_epoch(e): the epoch's order depends on (seed, e) only, rank r
reads every world_size-th index, so skipping g // world_size indices per rank resumes exactly where the
job stopped. With data.record_ids every rank appends what it reads to RUN/samples/rank-N.jsonl
(`Record`): the proof that a resume, also on another world size, skips and repeats nothing.
Iterable data must shard itself and provide state_dict()/load_state_dict() describing the position
after the last sample it yielded; it is read in the training process (num_workers ignored).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sized
from pathlib import Path
from typing import Protocol, cast

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    default_collate,
)

from hpctrain.kernel import layout
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.rundir import RunFolder
from train_entry.config import TrainConfig
from train_entry.model import call_factory, load_object
from train_entry.state import Position


class Resumable(Protocol):
    """An iterable dataset that shards itself and knows its position (see the module docstring)."""

    def __iter__(self) -> Iterator[object]: ...

    def state_dict(self) -> object: ...

    def load_state_dict(self, state: object) -> None: ...


Samples = Dataset[object] | Resumable


class Progressions(Dataset[dict[str, torch.Tensor]]):
    """Demo task: arithmetic progressions mod V, x_i = (a + i*k) % V, with random a and k per sample.

    The first two tokens are unpredictable (loss is masked there); every later token follows from the
    two before it, so a model that learns the rule drives the loss from ln(V) (chance) towards 0.
    Sample i is a pure function of (seed, i): no downloads, no state.
    """

    def __init__(self, *, vocab_size: int, seq_len: int, num_samples: int, seed: int = 0) -> None:
        self.v, self.len, self.n, self.seed = vocab_size, seq_len, num_samples, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(i))
        a, k = torch.randint(0, self.v, (2,), generator=g)
        x = (a + k * torch.arange(self.len + 1)) % self.v
        targets = x[1:].clone()
        targets[0] = -100  # x_1 cannot be known from x_0 alone
        return {"idx": x[:-1], "targets": targets}


def build_dataset(config: TrainConfig, *, rank: int, world_size: int) -> Samples:
    if config.data.factory is None:
        m = config.model
        return Progressions(
            vocab_size=m.vocab_size,
            seq_len=m.seq_len,
            num_samples=config.data.num_samples,
            seed=config.train.seed,
        )
    ds = call_factory(
        load_object(config.data.factory, "data.factory"),
        config=config,
        rank=rank,
        world_size=world_size,
    )
    if isinstance(ds, IterableDataset) or (
        not hasattr(ds, "__getitem__") and hasattr(ds, "__iter__")
    ):
        if not (hasattr(ds, "state_dict") and hasattr(ds, "load_state_dict")):
            raise UserError(
                f"data.factory '{config.data.factory}' returned an iterable without "
                f"state_dict()/load_state_dict(); add them so a resume continues exactly, "
                f"or return a map-style Dataset"
            )
    elif not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")):
        raise UserError(
            f"data.factory '{config.data.factory}' returned {type(ds).__name__}: need a "
            f"map-style Dataset (__getitem__ + __len__) or an iterable with state_dict()"
        )
    return cast(Samples, ds)


class Record:
    """RUN/samples/rank-N.jsonl: one line per micro-batch this rank read, {"epoch": e, "pos": [global
    positions in the epoch's order], "ids": [dataset indices]}. The positions come from the indices
    the DataLoader was handed (rank r's l-th is the epoch order's l * world + r), so the files of
    every rank and every run of a job, merged (`recorded`), give the job's order at any world size."""

    def __init__(self, run_dir: Path, rank: int) -> None:
        # open for the run, one line per read (appended: every run of the job adds to it)
        self.file = RunFolder(run_dir).open_log(f"{layout.SAMPLES}/rank-{rank}.jsonl")

    def add(self, epoch: int, pos: list[int], ids: list[int]) -> None:
        # flushed per line: a killed rank's record ends where its reading did
        self.file.write(json.dumps({"epoch": epoch, "pos": pos, "ids": ids}) + "\n")
        self.file.flush()


def recorded(run_dir: Path) -> list[tuple[int, int, int]]:
    """Every (epoch, position, sample id) of a run's record, sorted: the job's order. A position
    read twice (a repeat) is in it twice."""
    rows = []
    for path in sorted((run_dir / layout.SAMPLES).glob("rank-*.jsonl")):
        for line in path.read_text().splitlines():
            d = json.loads(line)
            rows += [(d["epoch"], p, i) for p, i in zip(d["pos"], d["ids"], strict=True)]
    return sorted(rows)


class Batches:
    """Micro-batches for this rank, forever (epoch after epoch), with `position` to save and restore."""

    def __init__(
        self,
        dataset: Samples,
        *,
        micro_batch: int,
        rank: int,
        world_size: int,
        seed: int,
        shuffle: bool = True,
        collate: Callable[[list[object]], object] | None = None,
        num_workers: int = 0,
        record: Record | None = None,
    ) -> None:
        self.ds, self.micro, self.rank, self.world = dataset, micro_batch, rank, world_size
        self.collate = collate or default_collate
        self.num_workers = num_workers
        self.iterable = not hasattr(dataset, "__getitem__") or isinstance(dataset, IterableDataset)
        if not self.iterable:
            self.sampler: DistributedSampler[object] = DistributedSampler(
                cast("Dataset[object]", dataset),
                num_replicas=world_size,
                rank=rank,
                shuffle=shuffle,
                seed=seed,
                drop_last=True,
            )
            if len(self.sampler) < micro_batch:
                raise UserError(
                    f"the dataset has {len(cast(Sized, dataset))} samples: fewer than world_size"
                    f"({world_size}) * train.micro_batch({micro_batch}); use more data"
                )
        self.epoch, self.offset = 0, 0  # offset: samples the whole job consumed in this epoch
        self._it: Iterator[object] | None = None
        self._order: list[int] = []  # this rank's indices of the epoch (the record reads them)
        self.record = None if self.iterable else record  # an iterable's items carry no index

    @property
    def stream(self) -> Resumable:
        return cast(Resumable, self.ds)

    @property
    def position(self) -> Position:
        if self.iterable:
            return {"iterable": self.stream.state_dict()}
        return {"epoch": self.epoch, "offset": self.offset}

    def restore(self, position: Position) -> None:
        if not position:
            return
        if self.iterable:
            self.stream.load_state_dict(position["iterable"])
        else:
            self.epoch, self.offset = int(position["epoch"]), int(position["offset"])
        self._it = None

    def __iter__(self) -> Batches:
        return self

    def __next__(self) -> object:
        if self.iterable:
            if self._it is None:
                self._it = iter(self.stream)
            items = []
            for _ in range(self.micro):
                try:
                    items.append(next(self._it))
                except StopIteration:  # a finite iterable starts over: a new epoch
                    self.epoch += 1
                    self._it = iter(self.stream)
                    items.append(next(self._it))
            return self.collate(items)
        if self._it is None:
            self._it = self._loader()
        try:
            batch = next(self._it)
        except StopIteration:
            self.epoch, self.offset = self.epoch + 1, 0
            self._it = self._loader()
            batch = next(self._it)
        if self.record is not None:
            first = self.offset // self.world
            local = range(first, first + self.micro)
            pos = [i * self.world + self.rank for i in local]
            self.record.add(self.epoch, pos, [self._order[i] for i in local])
        self.offset += self.micro * self.world
        return batch

    def _loader(self) -> Iterator[object]:
        self.sampler.set_epoch(self.epoch)
        skip = self.offset // self.world
        self._order = list(cast("Iterable[int]", self.sampler))
        indices = self._order[skip:]
        return iter(
            DataLoader(
                cast("Dataset[object]", self.ds),
                batch_size=self.micro,
                sampler=indices,
                collate_fn=self.collate,
                num_workers=self.num_workers,
                drop_last=True,
            )
        )


def build_batches(
    config: TrainConfig, *, rank: int, world_size: int, run_dir: Path | None = None
) -> Batches:
    """`run_dir`: where data.record_ids records (given by one rank of each data shard)."""
    dataset = build_dataset(config, rank=rank, world_size=world_size)
    record = Record(run_dir, rank) if run_dir is not None and config.data.record_ids else None
    collate = load_object(config.data.collate, "data.collate") if config.data.collate else None
    return Batches(
        dataset,
        micro_batch=config.train.micro_batch,
        rank=rank,
        world_size=world_size,
        seed=config.train.seed,
        shuffle=config.data.shuffle,
        collate=collate,
        num_workers=config.data.num_workers,
        record=record,
    )


def to_device(batch: object, device: torch.device) -> object:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def tokens_per_sample(batch: object) -> int | None:
    """Sequence length of the first 2-D integer tensor in a batch (for tokens/s), if there is one."""
    items = (
        batch.values()
        if isinstance(batch, dict)
        else batch
        if isinstance(batch, (list, tuple))
        else [batch]
    )
    for t in items:
        if isinstance(t, torch.Tensor) and t.dim() == 2 and not t.is_floating_point():
            return t.shape[1]
    return None
