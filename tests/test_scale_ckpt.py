"""Issue 37: a resume where each rank verifies only what it reads, W + 4 files a save, rank 0's
merge in one pass, and checkpoints of the layout before (one RNG file per rank) still loading.

The 2- and 4-rank runs are real gloo CPU saves and resumes (benchmarks/scale_ckpt.measure, the
bench's own runs): every rank holds parameters of its own (as FSDP shards do), so its share is its
weights file; read() bytes come from /proc/self/io (rchar) around `load_latest`."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the benchmarks package

from benchmarks.scale_ckpt import SLACK, measure, merge_ops  # noqa: E402
from hpctrain.kernel import checkpoint as fmt  # noqa: E402
from train_entry.checkpoint.checkpointer import Checkpointer  # noqa: E402
from train_entry.state import TrainState  # noqa: E402


def _rank0_bounds(m: dict[str, object]) -> None:
    share, manifest, total = m["share"], m["manifest"], m["total"]
    assert isinstance(share, int) and isinstance(manifest, int) and isinstance(total, int)
    for r in m["ranks"]:  # type: ignore[attr-defined]
        assert r["newest"]["equal"] and r["newest"]["rng"], r
    read = m["ranks"][0]["newest"]["read"]  # type: ignore[index]
    # its own weights file, .metadata, train_state.json, the manifest (+ procfs and the like)
    assert read <= share + manifest + SLACK, (read, share, manifest)
    assert read < total - (2 << 20)  # not the other ranks' files (3 MiB each)


def test_two_ranks_read_their_share_and_fall_back_together(tmp_path):
    m = measure(2, tmp_path, saves=2)
    assert m["files"] == 2 + 4, m["sizes"]
    assert m["fsyncs"] == 2 + 7
    assert sorted(m["sizes"]) == sorted(  # type: ignore[call-overload]
        ["__0_0.raw", "__1_0.raw", ".metadata", "train_state.json", "config.json", "MANIFEST.json"]
    )
    _rank0_bounds(m)
    # rank 1's newest weights file damaged (same size): every rank loads the save before
    for r in m["ranks"]:  # type: ignore[attr-defined]
        assert r["damaged"]["step"] == 1 and r["damaged"]["equal"], r
    log = m["ranks"][0]["log"]  # type: ignore[index]
    assert any("step-00000002 skipped: rank 1: __1_0.raw does not match" in x for x in log), log
    assert (tmp_path / "checkpoints" / "step-00000002").is_dir()  # never deleted


def test_four_ranks(tmp_path):
    m = measure(4, tmp_path)
    assert m["files"] == 4 + 4, m["sizes"]
    # a file each, the staging folder, the new `latest`, the checkpoints folder (was 2W + 8)
    assert m["fsyncs"] == 4 + 7
    _rank0_bounds(m)
    manifest = json.loads((tmp_path / "checkpoints/step-00000001/MANIFEST.json").read_text())
    assert fmt.rng_ranks(manifest) == [0, 1, 2, 3]


def test_merge_reads_each_entry_once():
    # rank 0's merge of 32k ranks' entries: one read per entry (a copy per rank was quadratic)
    reads, entries = merge_ops(32768)
    assert entries == 32768 and reads == entries


def _state(seed: int) -> TrainState:
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    return TrainState(model=model, optimizer=torch.optim.AdamW(model.parameters()), step=3)


def _to_old_layout(folder: Path) -> None:
    """Rewrite a checkpoint as hpctrain wrote it before issue 37: the generators in
    rng/rank-<R>.json, the weights file without them."""
    manifest = json.loads((folder / fmt.MANIFEST).read_text())
    for rank in fmt.rng_ranks(manifest):
        blob = fmt.rng_blob(folder, manifest, rank)
        assert blob is not None
        raw, entry = folder / fmt.raw_name(rank), manifest["files"][fmt.raw_name(rank)]
        data = raw.read_bytes()[: entry.pop(fmt.RNG)["offset"]]
        raw.write_bytes(data)
        entry.update(size=len(data), xxh3_128=xxhash.xxh3_128(data).hexdigest())
        (folder / "rng").mkdir(exist_ok=True)
        (folder / fmt.old_rng_name(rank)).write_bytes(blob)
        sha = hashlib.sha256(blob).hexdigest()
        manifest["files"][fmt.old_rng_name(rank)] = {"size": len(blob), "sha256": sha}
    (folder / fmt.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("old", [False, True])
def test_layouts_load_with_generators(tmp_path, old):
    state = _state(0)
    Checkpointer(tmp_path, strategy="ddp").save(state)
    folder = tmp_path / "checkpoints" / "step-00000003"
    if old:
        _to_old_layout(folder)
        assert (folder / "rng" / "rank-00000.json").is_file()
        assert fmt.verify(folder)[1] is None
    expect = torch.rand(5)  # the draw after the save's generators
    loaded = _state(1)
    torch.manual_seed(7)
    assert Checkpointer(tmp_path, strategy="ddp").load_latest(loaded) == 3
    assert torch.equal(torch.rand(5), expect)
    assert torch.equal(loaded.model.weight, state.model.weight)


def test_login_check_reads_no_file(tmp_path):
    # `hpctrain resume` checks the manifest (names, sizes) only: a flipped byte passes there and
    # is caught by the ranks' digests; a truncated or missing file is caught there
    Checkpointer(tmp_path, strategy="ddp").save(_state(0))
    folder = tmp_path / "checkpoints" / "step-00000003"
    raw = folder / fmt.raw_name(0)
    data = bytearray(raw.read_bytes())
    data[0] ^= 0xFF
    raw.write_bytes(bytes(data))
    assert fmt.check_manifest(folder)[1] is None
    assert "does not match" in str(fmt.verify(folder)[1])
    assert fmt.newest_verified(tmp_path / "checkpoints") is None
    raw.write_bytes(bytes(data[:-1]))
    assert "truncated" in str(fmt.check_manifest(folder)[1])
    (folder / ".metadata").unlink()
    assert "missing" in str(fmt.check_manifest(folder)[1])
