"""The checkpoint storage layer (train_entry/checkpoint/writer.py, staging.py) in one process: raw
per-rank files round-trip every dtype bit for bit, their checksums are the files' own, DCP's own
files still load, and an async save snapshots model buffers at the call."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
import torch.distributed.checkpoint as dcp
import xxhash
from torch import nn

from train_entry.checkpoint import Checkpointer, verify
from train_entry.checkpoint.writer import HashingWriter, RawReader, load_plain
from train_entry.state import TrainState

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def sample() -> dict:
    g = torch.Generator().manual_seed(1)
    return {
        "f32": torch.randn(33, 7, generator=g),
        "bf16": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "i64": torch.arange(11),
        "step": torch.tensor(3.0),  # 0-dim, as AdamW's step
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(6, 8, generator=g).t(),  # not contiguous
        "u8": torch.tensor([1, 2, 3], dtype=torch.uint8),
        "meta": {"lr": 0.1, "names": ["a", "b"], "n": 7},  # bytes items (pickled by DCP)
    }


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def test_raw_files_round_trip_every_dtype_and_carry_their_checksums(tmp_path) -> None:
    sd = sample()
    writer = HashingWriter(tmp_path)
    dcp.save({"app": sd}, storage_writer=writer)
    assert sorted(writer.entries) == [".metadata", "__0_0.raw"]
    for rel, entry in writer.entries.items():
        data = (tmp_path / rel).read_bytes()
        assert entry["size"] == len(data)
        if rel.endswith(".raw"):  # the weights: xxh3_128, the rest sha256 (both verify)
            assert entry["xxh3_128"] == xxhash.xxh3_128(data).hexdigest() and "sha256" not in entry
        else:
            assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    into = {"app": {k: torch.empty_like(v) for k, v in sd.items() if isinstance(v, torch.Tensor)}}
    dcp.load(into, storage_reader=RawReader(str(tmp_path)))
    assert same(
        {k: v for k, v in into["app"].items() if k != "meta"},
        {k: v for k, v in sd.items() if k != "meta"},
    )
    assert same(load_plain(tmp_path)["app"], sd)


def test_a_manifest_of_sha256_entries_still_verifies_and_a_changed_byte_fails(tmp_path) -> None:
    """The weights files' entries name xxh3_128, the others sha256; checkpoints from before list
    sha256 for every file and still verify; a flipped byte fails either."""
    from hpctrain.kernel.checkpoint import MANIFEST

    state = TrainState(model=nn.Linear(4, 2), optimizer=None, scheduler=None, data={}, config={})
    state.step = 1
    Checkpointer(tmp_path, strategy="ddp", log=lambda m: None).save(state)
    folder = tmp_path / "checkpoints" / "step-00000001"
    manifest = json.loads((folder / MANIFEST).read_text())
    kinds = {a for e in manifest["files"].values() for a in e if a not in ("size", "rng")}
    assert kinds == {"sha256", "xxh3_128"} and verify(folder)[1] is None
    raw = next(folder.glob("__*_0.raw"))
    good = raw.read_bytes()

    def flipped() -> str:
        raw.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
        why = verify(folder)[1] or ""
        raw.write_bytes(good)
        return why

    assert "does not match its xxh3_128 checksum" in flipped()
    for rel, entry in manifest["files"].items():  # as the writer before issue 13 wrote it
        entry.pop("xxh3_128", None)
        entry["sha256"] = hashlib.sha256((folder / rel).read_bytes()).hexdigest()
    (folder / MANIFEST).write_text(json.dumps(manifest))
    assert verify(folder)[1] is None
    assert "does not match its sha256 checksum" in flipped()
    assert verify(folder)[1] is None


def test_checkpoints_in_dcp_own_format_still_load(tmp_path) -> None:
    sd = sample()
    dcp.save({"app": sd}, checkpoint_id=str(tmp_path))  # stock FileSystemWriter
    assert list(tmp_path.glob("*.distcp")) and not list(tmp_path.glob("*.raw"))
    assert same(load_plain(tmp_path)["app"], sd)


class WithBuffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("seen", torch.zeros(4))

    def forward(self, x):
        self.seen += 1  # a forward pass changes a buffer in place
        return self.lin(x)


def test_async_save_copies_buffers_at_the_call_and_params_before_the_next_step(tmp_path) -> None:
    torch.manual_seed(0)
    model = WithBuffer()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    state = TrainState(model=model, optimizer=opt, scheduler=None, data={}, config={})

    def step() -> None:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        state.step += 1

    step()
    ckpt = Checkpointer(tmp_path, strategy="ddp", async_save=True, log=lambda m: None)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    ckpt.save(state, sync=False)
    step()  # the buffer changes at once, the params after the hook
    step()
    ckpt.wait()
    folder = tmp_path / "checkpoints" / "step-00000001"
    assert verify(folder)[1] is None and list(folder.glob("__*_0.raw"))
    saved = load_plain(folder)["app"]["model"]
    assert set(saved) == set(want) and all(torch.equal(saved[k], want[k]) for k in want)
    assert not torch.equal(model.seen, want["seen"])
    assert ckpt.timings[0]["async"] and "staging_s" in ckpt.timings[0]["phases"]


@pytest.mark.parametrize("async_save", [False, True])
def test_cached_state_dict_and_plan_follow_the_live_state(tmp_path, async_save) -> None:
    """Later saves reuse the first one's state dict and DCP plan while every tensor is the same;
    what they write is still the state as of each save (lr from the scheduler, optimizer moments),
    and a changed layout (a new param group) is planned afresh."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model[0].parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    state = TrainState(model=model, optimizer=opt, scheduler=sched, data={}, config={})
    ckpt = Checkpointer(tmp_path, strategy="ddp", async_save=async_save, log=lambda m: None)

    def step() -> None:
        model(torch.randn(3, 4)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        if state.scheduler is not None:
            sched.step()
        state.step += 1

    def saved_matches() -> None:
        lrs = [g["lr"] for g in opt.param_groups]
        moments = [s["exp_avg"].clone() for s in opt.state.values()]
        snapshot = {k: v.clone() for k, v in model.state_dict().items()}
        ckpt.save(state, sync=not async_save)
        step()  # training goes on while an async save writes
        ckpt.wait()
        folder = tmp_path / "checkpoints" / f"step-{state.step - 1:08d}"
        assert verify(folder)[1] is None
        got = load_plain(folder)["app"]
        assert all(torch.equal(got["model"][k], snapshot[k]) for k in snapshot)
        assert [g["lr"] for g in got["optim"]["param_groups"]] == lrs
        assert len(got["optim"]["state"]) == len(moments)
        assert all(
            any(torch.equal(m, s["exp_avg"]) for s in got["optim"]["state"].values())
            for m in moments
        )

    for _ in range(3):
        step()
        saved_matches()
    assert ckpt._state_dicts.reused and ckpt._plans.final is not None
    opt.add_param_group({"params": model[1].parameters(), "lr": 0.05})
    state.scheduler = None  # LambdaLR has one lambda per group
    step()
    saved_matches()  # a new layout: the state dict and the plan are built again
    assert not ckpt._state_dicts.reused
    assert (
        len(
            load_plain(tmp_path / "checkpoints" / f"step-{state.step - 1:08d}")["app"]["optim"][
                "param_groups"
            ]
        )
        == 2
    )
