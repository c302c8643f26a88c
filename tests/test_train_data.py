"""The data stream's position: exact after restore, independent of the world size, epochs reshuffle."""

from __future__ import annotations

import torch

from train_entry.data import Batches, Progressions


def ds(n: int = 40) -> Progressions:
    return Progressions(vocab_size=16, seq_len=6, num_samples=n, seed=3)


def stream(world: int, rank: int, micro: int = 2, **kw) -> Batches:
    return Batches(ds(), micro_batch=micro, rank=rank, world_size=world, seed=5, **kw)


def ids(batch: dict) -> list[tuple]:
    return [tuple(row.tolist()) for row in batch["idx"]]


def test_demo_task_rule_and_mask():
    item = ds()[7]
    x, y = item["idx"], item["targets"]
    assert y[0] == -100  # x_1 unknowable
    k = (x[1] - x[0]) % 16
    assert all((x[i + 1] - x[i]) % 16 == k for i in range(len(x) - 1))  # the progression rule
    assert torch.equal(y[1:-1], x[2:])  # next-token targets
    assert torch.equal(ds()[7]["idx"], x)  # pure function of i


def test_restore_continues_exactly_across_an_epoch():
    a = stream(1, 0)
    for _ in range(17):  # 20 batches per epoch: stop inside epoch 0
        next(a)
    pos = a.position
    assert pos == {"epoch": 0, "offset": 34}
    b = stream(1, 0)
    b.restore(pos)
    for _ in range(10):  # crosses into epoch 1
        assert ids(next(a)) == ids(next(b))
    assert a.position == b.position == {"epoch": 1, "offset": 14}


def test_epochs_reshuffle_and_cover_everything():
    a = stream(1, 0)
    epoch0 = [r for _ in range(20) for r in ids(next(a))]
    epoch1 = [r for _ in range(20) for r in ids(next(a))]
    assert len(epoch0) == len(ds())
    assert sorted(epoch0) == sorted(epoch1) and epoch0 != epoch1


def test_position_is_world_size_independent():
    """Saved by 2 ranks after 3 steps, resumed by 1 rank: the samples that follow are the same set."""
    r0, r1 = stream(2, 0), stream(2, 1)
    for _ in range(3):
        next(r0), next(r1)
    assert r0.position == r1.position == {"epoch": 0, "offset": 12}
    two = sorted(ids(next(r0)) + ids(next(r1)))
    one = stream(1, 0, micro=4)
    one.restore({"epoch": 0, "offset": 12})
    assert sorted(ids(next(one))) == two


class Counting(torch.utils.data.IterableDataset):
    """An iterable user dataset with a position: state_dict() is where the next item comes from."""

    def __init__(self) -> None:
        self.i = 0

    def __iter__(self):
        while self.i < 7:
            self.i += 1
            yield torch.tensor([self.i - 1])

    def state_dict(self) -> dict:
        return {"i": self.i}

    def load_state_dict(self, sd: dict) -> None:
        self.i = sd["i"]


def test_iterable_dataset_position():
    a = Batches(Counting(), micro_batch=2, rank=0, world_size=1, seed=0)
    assert next(a).flatten().tolist() == [0, 1]
    pos = a.position
    b = Batches(Counting(), micro_batch=2, rank=0, world_size=1, seed=0)
    b.restore(pos)
    assert next(b).flatten().tolist() == next(a).flatten().tolist() == [2, 3]
