"""A resume on another world size, per strategy, with the sample-id proof (data.record_ids): the
ids every rank of every run read, merged in the job's order (train_entry/data.py `recorded`), equal
an uninterrupted run's list, none skipped, none repeated. DeepSpeed goes through its universal
checkpoint (train_entry/checkpoint/universal.py): ZeRO-2 and ZeRO-3, each 2 -> 4 -> 2 in one job, in
the main suite (the lane runs only the in-process tests here). Real torchrun + gloo on CPU, the smallest
demo model, a global batch of 8 (accumulation 2 on 2 ranks, 1 on 4), 40 samples an epoch (5 steps).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.kernel import jobenv
from train_entry.data import Batches, Progressions, Record, recorded

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
TORCHRUN = str(Path(PY).parent / "torchrun")
TINY = (
    "--model.d_model=8",
    "--model.n_heads=1",
    "--model.n_layers=1",
    "--train.global_batch=8",
    "--train.micro_batch=2",
    "--data.num_samples=40",
    "--schedule.decay=constant",  # the learning rate of a step does not depend on max_steps
    "--data.record_ids=true",
)


def train(run: Path, nproc: int, *args: str, stop_at: int | None = None) -> str:
    """One torchrun of train_entry; stop_at: saved and stopped there (exit 75, torchrun's 1)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith((jobenv.PREFIX, "RANK", "WORLD_SIZE", "MASTER_", "LOCAL_RANK"))
    }
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", PYTHONPATH=str(REPO))
    env[jobenv.DEVICE] = "cpu"
    if stop_at is not None:
        env[jobenv.STOP_AT_STEP] = str(stop_at)
    launch = [TORCHRUN, "--standalone", f"--nproc-per-node={nproc}"] if nproc > 1 else [PY]
    cmd = [*launch, "-m", "train_entry", "--run-dir", str(run), *TINY, *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    # torchrun reports a rank's 75 (stopped, saved) as its own failure: 1
    expect = 0 if stop_at is None else 1 if nproc > 1 else 75
    assert res.returncode == expect, f"{' '.join(cmd)} -> {res.returncode}\n{res.stderr[-4000:]}"
    return res.stdout + res.stderr


def losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def ids(run: Path) -> list[int]:
    """The proof: the job's (epoch, position) keys each read once, and its ids in that order."""
    rows = recorded(run)
    keys = [(epoch, pos) for epoch, pos, _ in rows]
    assert len(keys) == len(set(keys)), "a sample position was read twice"
    return [i for _, _, i in rows]


def read(run: Path, world: int, samples: int, position: dict | None = None) -> dict:
    """In-process: `world` ranks' Batches (the demo task, 40 samples an epoch) read `samples` in
    micro-batches of 2 from `position`, recorded in run/samples; the position after."""
    data = Progressions(vocab_size=16, seq_len=4, num_samples=40, seed=0)
    ranks = [
        Batches(data, micro_batch=2, rank=r, world_size=world, seed=0, record=Record(run, r))
        for r in range(world)
    ]
    for b in ranks:
        b.restore(position or {})
        for _ in range(samples // (2 * world)):
            next(b)
    return dict(ranks[0].position)


@pytest.mark.parametrize("worlds", [(2, 4), (4, 2), (1, 4)])
def test_the_record_proves_a_resize_and_catches_a_wrong_position(tmp_path, worlds):
    """The record without processes: read on worlds[0] ranks, resumed on worlds[1], across the
    epoch (40 samples), equals one rank's reading; a position off by one micro-batch (a skip, or a
    repeat) does not."""
    read(tmp_path / "one", 1, 64)  # the epoch and 24 samples of the next
    one = ids(tmp_path / "one")
    resized = tmp_path / "resized"
    at = read(resized, worlds[0], 16)
    assert at == {"epoch": 0, "offset": 16}
    read(resized, worlds[1], 48, at)
    assert ids(resized) == one
    for wrong in (8, 24):  # repeats 8 samples, skips 8
        bad = tmp_path / f"bad-{wrong}"
        read(bad, worlds[0], 16)
        read(bad, worlds[1], 48, {"epoch": 0, "offset": wrong})
        with pytest.raises(AssertionError):
            assert ids(bad) == one


def test_a_conversion_goes_once_its_original_is_pruned(tmp_path):
    from train_entry.checkpoint import universal

    ckpt = tmp_path / "checkpoints"
    for name in ("step-00000002", "universal/step-00000001", "universal/step-00000002"):
        (ckpt / name).mkdir(parents=True)
    universal.drop_orphans(ckpt)
    assert sorted(p.name for p in (ckpt / "universal").iterdir()) == ["step-00000002"]
    assert universal.target(ckpt / "step-00000002") == ckpt / "universal" / "step-00000002"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run: one process (the ids do not depend on the world size: that is the
    claim), 6 steps (crosses the epoch at step 5)."""
    run = tmp_path_factory.mktemp("ref") / "run"
    train(run, 1, "--strategy=ddp", "--max-steps=6")
    assert len(ids(run)) == 6 * 8
    return run


def check(run: Path, reference: Path, steps: int) -> None:
    assert ids(run) == ids(reference)[: steps * 8]
    ref, got = losses(reference), losses(run)
    for step in range(3, steps + 1):  # the weights (step 3) and the optimizer (after) came back
        assert got[step] == pytest.approx(ref[step], rel=1e-5), step


@pytest.mark.slow  # starts torchrun
@pytest.mark.timeout(300)
def test_ddp_and_fsdp_resize_and_the_ids_prove_it(tmp_path, reference):
    """DDP 2 ranks -> 1 (stopped again at 4), then FSDP on 2 to the end, across the epoch: one job,
    three runs, every sample of the uninterrupted run read once, in its order. (DDP and FSDP share
    DCP's format: FSDP reshards what DDP saved as it reshards its own.)"""
    run = tmp_path / "run"
    train(run, 2, "--strategy=ddp", "--max-steps=6", stop_at=2)
    out = train(run, 1, "--strategy=ddp", "--max-steps=6", stop_at=4)
    assert "saved by 2 ranks, loaded by 1" in out
    out = train(run, 2, "--strategy=fsdp", "--max-steps=6")
    assert "saved by 1 ranks, loaded by 2" in out
    check(run, reference, 6)


# Main suite only (not `lane`): under the lane (torch 2.7.1, DeepSpeed 0.17.6) ZeRO-2 4 -> 2
# completes but its step-4 loss was 2e-5 relative from the reference (session 17; not explained yet)
@pytest.mark.slow  # starts torchrun
@pytest.mark.timeout(450)
@pytest.mark.parametrize("stage", [2, 3], ids=["zero2", "zero3"])
def test_deepspeed_resumes_on_another_world_size(tmp_path, reference, stage):
    """2 ranks, stopped at 2 -> 4 ranks, stopped at 4 -> 2 ranks to the end, across the epoch: one
    job, both directions. Each resize converts once to the universal form next to its original
    (which is left as it was), verified by its manifest, loaded, and the run completes with the
    reference's samples."""
    from hpctrain.kernel import checkpoint as fmt

    run = tmp_path / "run"
    strategy = ("--strategy=deepspeed", f"--deepspeed.zero_stage={stage}", "--max-steps=6")
    train(run, 2, *strategy, stop_at=2)
    for saved, worlds, stop_at in ((2, (2, 4), 4), (4, (4, 2), None)):
        assert len(ids(run)) == saved * 8  # the stop came at a checkpoint: nothing read after it
        original = run / "checkpoints" / f"step-{saved:08d}"
        before = json.loads((original / "MANIFEST.json").read_text())
        out = train(run, worlds[1], *strategy, stop_at=stop_at)
        assert f"saved by {worlds[0]} ranks, loaded by {worlds[1]}" in out
        assert "to DeepSpeed's universal form" in out
        converted, why = fmt.verify(run / "checkpoints" / "universal" / original.name)
        assert why is None and converted is not None and converted["universal"] is True
        # nothing lost: the original still verifies (checked before the next save prunes it)
        assert fmt.verify(original) == (before, None)
    check(run, reference, 6)
