"""Checkpointer in one process: atomic layout, manifest verification, skipping damaged checkpoints
without deleting them, pruning, async save, the tensor-exact JSON, StopFlag, params_sha256."""

from __future__ import annotations

import json
import os
import shutil
import signal
import warnings

import pytest
import torch
from torch import nn

from hpctrain.kernel import jobenv
from hpctrain.kernel.errors import UserError
from train_entry.checkpoint import Checkpointer, newest_verified, step_folders, verify
from train_entry.preempt import StopFlag
from train_entry.state import TrainState, capture_rng, dumps, loads, params_sha256, restore_rng

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def make_state(seed: int = 0) -> TrainState:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return TrainState(
        model=model,
        optimizer=opt,
        scheduler=sched,
        data={"epoch": 0, "offset": 0},
        config={"model": "tiny"},
    )


def train_step(state: TrainState) -> None:
    loss = state.model(torch.randn(3, 4)).pow(2).sum()
    loss.backward()
    state.optimizer.step()
    state.optimizer.zero_grad()
    state.scheduler.step()
    state.step += 1
    state.data["offset"] += 3


def run(tmp_path, steps: int, every: int = 1, **kw) -> tuple[TrainState, Checkpointer, list[str]]:
    logs: list[str] = []
    state = make_state()
    ckpt = Checkpointer(tmp_path, strategy="ddp", every_steps=every, log=logs.append, **kw)
    for _ in range(steps):
        train_step(state)
        ckpt.maybe_save(state)
    ckpt.wait()
    return state, ckpt, logs


def test_save_is_atomic_and_verified(tmp_path):
    state, _, _ = run(tmp_path, 2)
    ck = tmp_path / "checkpoints"
    assert (ck / "latest").read_text() == "step-00000002\n"
    assert not list(ck.glob(".staging-*"))
    folder = ck / "step-00000002"
    manifest, why = verify(folder)
    assert why is None
    assert manifest["step"] == 2 and manifest["world_size"] == 1 and manifest["strategy"] == "ddp"
    assert manifest["torch"] == torch.__version__
    on_disk = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert sorted([*manifest["files"], "MANIFEST.json"]) == on_disk
    # W + 4 files (issue 37): the rank's generators are the tail of its weights file
    assert set(manifest["files"]) == {"train_state.json", "config.json", "__0_0.raw", ".metadata"}
    assert manifest["files"]["__0_0.raw"]["rng"]["size"] > 0
    assert json.loads((folder / "config.json").read_text()) == {"model": "tiny"}


def test_resume_restores_everything(tmp_path):
    state, _, _ = run(tmp_path, 3)
    expected_hash, expected_rng = params_sha256(state.model), capture_rng()
    expected_lr = state.scheduler.get_last_lr()
    torch.manual_seed(99)  # scramble the generators
    fresh = make_state(seed=7)  # other weights
    step = Checkpointer(tmp_path, strategy="ddp", every_steps=1, log=lambda m: None).load_latest(
        fresh
    )
    assert step == 3 and fresh.step == 3 and fresh.data == {"epoch": 0, "offset": 9}
    assert params_sha256(fresh.model) == expected_hash
    assert fresh.scheduler.get_last_lr() == expected_lr
    assert torch.equal(capture_rng()["torch"], expected_rng["torch"])
    # and the optimizer moments came back: one more identical step gives identical weights
    torch.manual_seed(5)
    train_step(state)
    torch.manual_seed(5)
    train_step(fresh)
    assert params_sha256(fresh.model) == params_sha256(state.model)


def test_no_checkpoint_starts_fresh(tmp_path):
    state = make_state()
    assert Checkpointer(tmp_path, strategy="fsdp").load_latest(state) is None
    assert state.step == 0


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "missing-manifest", "missing-file"])
def test_damaged_newest_is_reported_and_skipped_never_deleted(tmp_path, damage):
    run(tmp_path, 3)
    newest = tmp_path / "checkpoints" / "step-00000003"
    shard = newest / "__0_0.raw"
    if damage == "truncate":
        os.truncate(shard, shard.stat().st_size // 2)
    elif damage == "corrupt":
        with open(shard, "r+b") as f:
            f.seek(10)
            byte = f.read(1)
            f.seek(10)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif damage == "missing-manifest":
        (newest / "MANIFEST.json").unlink()
    else:
        (newest / "train_state.json").unlink()
    before = sorted(p.as_posix() for p in (tmp_path / "checkpoints").rglob("*"))
    logs: list[str] = []
    state = make_state()
    assert Checkpointer(tmp_path, strategy="ddp", log=logs.append).load_latest(state) == 2
    warning = [m for m in logs if "step-00000003" in m]
    assert len(warning) == 1 and "skipped" in warning[0]
    reason = {
        "truncate": "truncated",
        "corrupt": "corrupted",
        "missing-manifest": "did not finish",
        "missing-file": "missing",
    }[damage]
    assert reason in warning[0]
    assert sorted(p.as_posix() for p in (tmp_path / "checkpoints").rglob("*")) == before


def test_damage_found_as_the_weights_are_copied_falls_back_over_them(tmp_path):
    # A weights file's digest is taken as its tensors are copied (one pass over its bytes): a
    # byte flipped after the last tensor is found once they are all in the model; the older
    # checkpoint then loads over every one, and with none left the load refuses a fresh start.
    run(tmp_path, 3)
    ck = tmp_path / "checkpoints"
    older = tmp_path / "older"
    shutil.copytree(ck, older / "checkpoints")
    shutil.rmtree(older / "checkpoints" / "step-00000003")
    expected = make_state(seed=3)
    assert Checkpointer(older, strategy="ddp", log=lambda m: None).load_latest(expected) == 2

    def flip_before_rng(step: int) -> None:
        folder = ck / f"step-{step:08d}"
        at = json.loads((folder / "MANIFEST.json").read_text())["files"]["__0_0.raw"]["rng"]
        with open(folder / "__0_0.raw", "r+b") as f:
            f.seek(at["offset"] - 1)  # the padding after the last tensor, inside the digest
            byte = f.read(1)
            f.seek(at["offset"] - 1)
            f.write(bytes([byte[0] ^ 0xFF]))

    flip_before_rng(3)
    logs: list[str] = []
    state = make_state(seed=7)
    assert Checkpointer(tmp_path, strategy="ddp", log=logs.append).load_latest(state) == 2
    assert any("step-00000003 skipped" in m and "corrupted" in m for m in logs), logs
    assert params_sha256(state.model) == params_sha256(expected.model)
    assert all(
        torch.equal(a, b)
        for a, b in zip(
            state.optimizer.state_dict()["state"][0].values(),
            expected.optimizer.state_dict()["state"][0].values(),
            strict=True,
        )
    )
    flip_before_rng(2)
    with pytest.raises(UserError, match="cannot start afresh"):
        Checkpointer(tmp_path, strategy="ddp", log=lambda m: None).load_latest(make_state(seed=7))


def test_resaving_a_step_that_did_not_verify_keeps_the_bad_copy(tmp_path):
    run(tmp_path, 3)
    bad = tmp_path / "checkpoints" / "step-00000003"
    (bad / "train_state.json").write_text("{}")
    state = make_state()
    ckpt = Checkpointer(tmp_path, strategy="ddp", every_steps=1, log=lambda m: None)
    assert ckpt.load_latest(state) == 2
    train_step(state)
    ckpt.maybe_save(state)
    assert verify(bad)[1] is None  # a fresh, good step 3
    kept = list(bad.parent.glob("step-00000003.unverified-*"))
    assert len(kept) == 1 and (kept[0] / "train_state.json").read_text() == "{}"


def test_half_written_staging_is_ignored_then_replaced(tmp_path):
    run(tmp_path, 2)
    staging = tmp_path / "checkpoints" / ".staging-step-00000003"
    staging.mkdir()
    (staging / "__0_0.raw").write_bytes(b"half")
    state = make_state()
    ckpt = Checkpointer(tmp_path, strategy="ddp", every_steps=1, log=lambda m: None)
    assert ckpt.load_latest(state) == 2
    train_step(state)
    ckpt.maybe_save(state)
    assert not staging.exists() and verify(tmp_path / "checkpoints" / "step-00000003")[1] is None


def test_stale_staging_of_an_older_step_is_cleaned_after_a_newer_commit(tmp_path):
    run(tmp_path, 2)
    stale = tmp_path / "checkpoints" / ".staging-step-00000001"
    stale.mkdir()
    newer = tmp_path / "checkpoints" / ".staging-step-00000009"  # not older: left alone
    newer.mkdir()
    state = make_state()
    ckpt = Checkpointer(tmp_path, strategy="ddp", every_steps=1, log=lambda m: None)
    ckpt.load_latest(state)
    train_step(state)
    ckpt.maybe_save(state)
    assert not stale.exists() and newer.exists()


def test_prune_keeps_the_newest_and_never_below_two(tmp_path):
    run(tmp_path, 5, keep=3)
    assert [s for s, _ in step_folders(tmp_path / "checkpoints")] == [5, 4, 3]
    with pytest.raises(UserError, match="keep at least 2"):
        Checkpointer(tmp_path, strategy="ddp", keep=1)


def test_triggers_every_n_steps_and_last(tmp_path):
    state = make_state()
    ckpt = Checkpointer(tmp_path, strategy="ddp", every_steps=3, log=lambda m: None)
    saved = []
    for _ in range(7):
        train_step(state)
        saved.append(ckpt.maybe_save(state))
    assert saved == [False, False, True, False, False, True, False]
    assert ckpt.maybe_save(state, last=True) and not ckpt.maybe_save(state, last=True)
    assert [s for s, _ in step_folders(tmp_path / "checkpoints")] == [7, 6]


def test_time_trigger(tmp_path):
    state = make_state()
    ckpt = Checkpointer(tmp_path, strategy="ddp", every_minutes=1e-9, log=lambda m: None)
    train_step(state)
    assert ckpt.maybe_save(state)
    ckpt = Checkpointer(tmp_path / "b", strategy="ddp", every_minutes=60, log=lambda m: None)
    assert not ckpt.maybe_save(state)


def test_async_save_snapshots_the_state_when_called(tmp_path):
    state = make_state()
    ckpt = Checkpointer(tmp_path, strategy="ddp", async_save=True, log=lambda m: None)
    train_step(state)
    expected = params_sha256(state.model)
    ckpt.save(state, sync=False)
    for _ in range(3):  # keep training while the write runs
        train_step(state)
    ckpt.wait()
    assert verify(tmp_path / "checkpoints" / "step-00000001")[1] is None
    fresh = make_state(seed=3)
    assert Checkpointer(tmp_path, strategy="ddp", log=lambda m: None).load_latest(fresh) == 1
    assert params_sha256(fresh.model) == expected


def test_deepspeed_loads_at_another_world_size_but_not_a_dcp_checkpoint(tmp_path):
    run(tmp_path, 1)
    manifest_path = tmp_path / "checkpoints" / "step-00000001" / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text())
    from train_entry.checkpoint.load import check_compatible

    with pytest.raises(UserError, match="DDP and FSDP checkpoints load into each other"):
        check_compatible(manifest_path.parent, manifest, strategy="deepspeed", world=1)
    # another world size goes through DeepSpeed's universal form (tests/test_resize.py)
    manifest["strategy"], manifest["world_size"] = "deepspeed", 4
    check_compatible(manifest_path.parent, manifest, strategy="deepspeed", world=2)


def test_newest_verified_without_torch_state(tmp_path):
    assert newest_verified(tmp_path / "checkpoints") is None
    run(tmp_path, 2)
    folder, manifest = newest_verified(tmp_path / "checkpoints")
    assert folder.name == "step-00000002" and manifest["step"] == 2


def test_json_codec_is_exact():
    obj = {
        "t": torch.tensor([1.5, float("nan"), -0.0], dtype=torch.bfloat16),
        "f": 0.1 + 0.2,
        "tup": (1, (2.0, "x")),
        3: "int key",
        "rng": capture_rng(),
    }
    back = loads(dumps(obj))
    assert back["t"].dtype == torch.bfloat16
    assert torch.equal(back["t"].view(torch.int16), obj["t"].view(torch.int16))
    assert back["f"] == obj["f"] and back["tup"] == obj["tup"] and back[3] == "int key"
    restore_rng(back["rng"])
    a = torch.rand(3)
    restore_rng(obj["rng"])
    assert torch.equal(a, torch.rand(3))


def test_params_sha256_ignores_wrappers_and_sees_one_bit():
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))

    class Wrapper(nn.Module):  # named like DDP: the hash must look inside
        def __init__(self, m):
            super().__init__()
            self.module = m

    Wrapper.__name__ = "DistributedDataParallel"
    digest = params_sha256(inner)
    assert params_sha256(Wrapper(inner)) == digest
    with torch.no_grad():
        flat = inner[0].weight.view(-1).view(torch.int32)
        flat[0] ^= 1
    assert params_sha256(inner) != digest


def test_stop_flag_signal_file_and_step(tmp_path, monkeypatch):
    monkeypatch.delenv(jobenv.STOP_AT_STEP, raising=False)
    stop_file = tmp_path / "STOP"
    flag = StopFlag(signals=("USR2",), stop_file=stop_file)
    old = signal.getsignal(signal.SIGUSR2)
    try:
        flag.install()
        assert not flag.agreed("cpu")
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.agreed("cpu") and flag.reason == "SIGUSR2"
    finally:
        signal.signal(signal.SIGUSR2, old)
    by_file = StopFlag(signals=(), stop_file=stop_file)
    assert not by_file.local()
    stop_file.touch()
    assert by_file.agreed("cpu") and "stop file" in by_file.reason
    monkeypatch.setenv(jobenv.STOP_AT_STEP, "4")
    at_step = StopFlag(signals=())
    assert not at_step.agreed("cpu", step=3) and at_step.agreed("cpu", step=4)


def test_unknown_strategy_is_a_user_error(tmp_path):
    with warnings.catch_warnings():
        with pytest.raises(UserError, match="unknown strategy"):
            Checkpointer(tmp_path, strategy="zero")
