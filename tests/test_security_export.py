"""Issue 33, finding 3: a checkpoint folder another account wrote runs no code when it is read.

A second, unprivileged account (tests/_accounts.py) plants run folders under its home, each
checkpoint with a manifest whose digests match (verification passes: a digest is no signature):
DCP's `.metadata` that is a pickle calling os.system, a runtime `state.pt` holding one, DeepSpeed
files holding one, and a real DCP checkpoint whose bytes item holds one. `hpctrain export` (as
tests/test_export.py runs it) and the DCP reader refuse each with one line, exit 2, and the marker
file the payload would touch never appears. Also: what DeepSpeed loads with the full unpickler is
read only from folders nobody else can write into, and exported files are never world-writable.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from _accounts import other_account
from test_export import cli as export
from test_export import one_line_exit_2 as refused
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from hpctrain.kernel import jobenv
from hpctrain.kernel.checkpoint import not_private, verify
from hpctrain.kernel.errors import UserError
from train_entry.checkpoint.safeload import load_metadata
from train_entry.checkpoint.writer import HashingWriter, load_plain

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

# Run as the attacker: each run folder RUN/checkpoints/step-00000001 with a matching manifest.
PLANT = r"""
import os, pickle, sys
from pathlib import Path
import torch
import torch.distributed.checkpoint as dcp
from hpctrain.kernel.checkpoint import staging_name, step_name, write_manifest
from train_entry.checkpoint.writer import HashingWriter

home, marker = Path(sys.argv[1]), sys.argv[2]

class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {marker}-{where}",))

def plant(name, strategy, files):
    global where
    where = name
    ckpt = home / name / "checkpoints"
    staging = ckpt / staging_name(1)
    staging.mkdir(parents=True)
    entries = files(staging) or {}
    write_manifest(staging, ckpt / step_name(1), {"step": 1, "strategy": strategy, "world_size": 1}, entries)
    os.rename(staging, ckpt / step_name(1))

plant("dcp", "ddp", lambda d: (d / ".metadata").write_bytes(pickle.dumps(Payload())) and None)
plant("script", "script", lambda d: torch.save({"model": {"w": torch.ones(2)}, "x": Payload()}, d / "state.pt"))
def deepspeed(d):
    torch.save({"module": {"w": torch.ones(2)}, "x": Payload()}, d / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": Payload()}, d / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
plant("deepspeed", "deepspeed", deepspeed)
plant("deepspeed0", "deepspeed", lambda d: torch.save({"module": Payload()}, d / "mp_rank_00_model_states.pt"))
def dcp_bytes(d):
    writer = HashingWriter(d)
    dcp.save({"app": {"model": {"w": torch.ones(2), "extra": Payload()}}}, storage_writer=writer)
    return writer.entries
plant("bytes", "ddp", dcp_bytes)
os.chmod(home, 0o755)
"""


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """(attacker, its home, marker): its run folders, made readable; each payload touches
    MARKER-<run folder's name>."""
    marker = tmp_path_factory.mktemp("victim") / "MARKER"
    with other_account("exp") as a:
        res = a.python(PLANT, str(a.home), str(marker), timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        yield a, a.home, marker


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("dcp", ["is not a DCP checkpoint's metadata (it names posix.system)", "refusing"]),
        ("script", ["state.pt: it holds posix.system", "refusing to load it"]),
        ("deepspeed", ["not to you", "full unpickler"]),
        ("deepspeed0", ["not to you", "full unpickler"]),
    ],
)
def test_export_of_a_planted_checkpoint_runs_none_of_its_code(planted, tmp_path, name, words):
    account, home, marker = planted
    folder = home / name / "checkpoints" / "step-00000001"
    assert verify(folder)[1] is None, "the digests match: verification alone cannot tell"
    assert folder.stat().st_uid == account.uid
    res = export(str(home / name), "--out", str(tmp_path / "out"))
    assert not Path(f"{marker}-{name}").exists(), "the checkpoint's pickle ran"
    refused(res, *words)
    assert not (tmp_path / "out").exists()


def test_a_planted_dcp_bytes_item_is_refused_by_the_reader(planted):
    _, home, marker = planted
    folder = home / "bytes" / "checkpoints" / "step-00000001"
    assert verify(folder)[1] is None
    assert load_metadata(folder / ".metadata").state_dict_metadata  # the metadata itself is DCP's
    with pytest.raises(UserError, match=r"app\.model\.extra: it holds posix\.system"):
        load_plain(folder)  # what check-resume's compare loads: every item, bytes too
    assert not Path(f"{marker}-bytes").exists()


def test_the_weights_of_a_checkpoint_with_a_planted_bytes_item_still_export(planted, tmp_path):
    """Export reads tensors only: the bytes item is left out unread."""
    _, home, marker = planted
    res = export(str(home / "bytes"), "--out", str(tmp_path / "w"), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["skipped"] == ["extra"]
    assert not Path(f"{marker}-bytes").exists()


def test_only_private_folders_pass_the_check_for_the_full_unpickler(planted, tmp_path):
    account = planted[0]
    run = tmp_path / "run"
    step = run / "checkpoints" / "step-00000001"
    step.mkdir(parents=True)
    (step / "mp_rank_00_model_states.pt").write_bytes(b"x")
    for p in (run, run / "checkpoints", step):
        p.chmod(0o755)
    assert not_private(step, run) is None
    os.chown(step / "mp_rank_00_model_states.pt", account.uid, account.gid)
    assert "not to you" in (not_private(step, run) or "")
    os.chown(step / "mp_rank_00_model_states.pt", 0, 0)
    (run / "checkpoints").chmod(0o777)
    assert "writable by other accounts (mode 0777)" in (not_private(step, run) or "")
    (run / "checkpoints").chmod(0o755)
    (step / "link").symlink_to(Path("/etc/passwd"))
    assert "is a symlink" in (not_private(step, run) or "")
    assert "not inside the run folder" in (not_private(step, tmp_path / "elsewhere") or "")


DTYPES = "float32 float64 float16 bfloat16 complex64 complex128 int8 int16 int32 int64 uint8 bool"
DTYPES += " float8_e4m3fn float8_e5m2 uint16 uint32 uint64"


def test_every_dtype_and_dcp_own_metadata_pass_the_restricted_unpickler(tmp_path):
    """The allow-list holds what real metadata names: every dtype, bytes items, and DCP's own
    FileSystemWriter (a Path in its StorageMeta)."""
    sd = {n: torch.zeros(2, dtype=getattr(torch, n)) for n in DTYPES.split() if hasattr(torch, n)}
    sd |= {"meta": {"lr": 0.1, "names": ["a"], "t": (1, 2), "none": None}}
    sd |= {"empty": torch.zeros(0, 4), "strided": torch.ones(3, 4).t(), "s": torch.tensor(1.0)}
    dcp.save({"app": sd}, storage_writer=HashingWriter(tmp_path / "raw"))
    dcp.save({"app": sd}, checkpoint_id=str(tmp_path / "stock"))
    tensors = {k: v.dtype for k, v in sd.items() if isinstance(v, torch.Tensor)}
    for name in ("raw", "stock"):
        md = load_metadata(tmp_path / name / ".metadata")
        got = {
            k.removeprefix("app."): m.properties.dtype
            for k, m in md.state_dict_metadata.items()
            if isinstance(m, TensorStorageMetadata)
        }
        assert got == tensors and "app.meta.lr" in md.state_dict_metadata, name


def test_exported_files_are_never_world_writable(tmp_path, monkeypatch):
    """Under umask 000 the export's folders and files keep their modes less write for others."""
    from hpctrain import runtime

    run = tmp_path / "own"
    monkeypatch.setenv(jobenv.RUN_DIR, str(run))
    runtime.Checkpoint(run / "checkpoints").save(
        1, {"model": {"w": torch.ones(3), "b": torch.ones(2)}}
    )
    old = os.umask(0)
    try:
        res = export(str(run), "--out", str(tmp_path / "new" / "deeper" / "w"))
        res2 = export(str(run), "--format", "torch", "--max-shard-size", "4")
    finally:
        os.umask(old)
    assert res.exit_code == 0 and res2.exit_code == 0, res.output + res2.output
    made = [tmp_path / "new", tmp_path / "new" / "deeper", run / "export"]
    made += [p for d in (tmp_path / "new", run / "export") for p in d.rglob("*")]
    modes = {str(p): oct(p.stat().st_mode & 0o777) for p in made}
    assert len(made) > 5 and all(p.stat().st_mode & 0o002 == 0 for p in made), modes
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o775, modes  # else as the umask gives


def test_the_runtime_api_loads_a_planted_state_with_none_of_its_code(planted, monkeypatch):
    """`runtime.Checkpoint.load` of a folder another account wrote: weights-only refuses the
    payload, and the full unpickler is not tried on a file that is not the user's own."""
    from hpctrain import runtime
    from hpctrain.kernel.errors import UserError

    _, home, marker = planted
    monkeypatch.delenv("RANK", raising=False)
    ckpt = runtime.Checkpoint(home / "script" / "checkpoints")
    with pytest.raises(UserError, match="not to you|writable by other accounts"):
        ckpt.load()
    assert not Path(f"{marker}-script").exists(), "the checkpoint's pickle ran"
