"""One tiny save + verify + load through the Checkpointer, in one process: each node's first rank runs
it at every start before the ranks meet (train_entry/trainer.py), so a checkpoint path that cannot
work there (a torch whose private checkpoint names moved, a folder it cannot write) is found before
training starts, not at the first save interval. It runs there, not in the preflight gate, because
the trainer has already paid the imports it needs (torch.distributed.checkpoint, ~1 s of CPU a
node), which the gate would pay again at every start (benchmarks/preflight.py).

    python -m train_entry.checkpoint.roundtrip DIR      # prints what it did, exit 1 on failure
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import torch

from train_entry.checkpoint.checkpointer import Checkpointer
from train_entry.state import TrainState


def round_trip(folder: Path) -> str:
    """Save a 2-layer model with its AdamW state into `folder`/checkpoints (every step of a real
    save: the raw writer, DCP's metadata, the manifest, the commit), verify it, load it into a
    fresh copy and compare every tensor. Returns a one-line summary; raises on any failure
    (SaveFailed, or AssertionError when the loaded state differs). `folder` is removed after."""
    t0 = time.perf_counter()

    def build() -> TrainState:
        g = torch.Generator().manual_seed(7)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        return TrainState(model=model, optimizer=opt, scheduler=None, data={}, config={})

    saved = build()
    assert saved.optimizer is not None  # build()'s AdamW
    saved.model(torch.ones(1, 8)).sum().backward()
    saved.optimizer.step()  # optimizer state, as a run's first save has
    saved.step = 1
    try:
        Checkpointer(folder, strategy="ddp", log=lambda m: None).save(saved)
        loaded = build()
        assert loaded.optimizer is not None
        step = Checkpointer(folder, strategy="ddp", log=lambda m: None).load_latest(loaded)
        if step != 1:
            raise AssertionError(f"the checkpoint just saved did not verify (loaded: {step})")
        want, got = saved.model.state_dict(), loaded.model.state_dict()
        differ = [k for k in want if not torch.equal(want[k], got[k])]
        a, b = saved.optimizer.state_dict()["state"], loaded.optimizer.state_dict()["state"]
        differ += [
            f"optimizer {i}.{k}"
            for i in a
            for k, v in a[i].items()
            if isinstance(v, torch.Tensor) and not torch.equal(v, b.get(i, {}).get(k, v + 1))
        ]
        if differ:
            raise AssertionError(f"loaded back different: {', '.join(differ)}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return f"save + verify + load of a tiny model in {time.perf_counter() - t0:.2f} s"


def problem(folder: Path) -> str | None:
    """None when `round_trip(folder)` passes, else one line saying what failed."""
    try:
        round_trip(folder)
        return None
    except BaseException as e:  # noqa: BLE001 - the failure is the finding (DCP's are Base)
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        why = getattr(e, "reason", None) or f"{type(e).__name__}: {e}".splitlines()[0]
        return f"a test save failed: {why}"[:600]


if __name__ == "__main__":
    print(round_trip(Path(sys.argv[1])))
