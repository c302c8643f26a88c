"""`hpctrain export` gives every file of an export one mode (issue 34: model.safetensors was 0600,
written so by safetensors, while config.json and the index were 0644, so colleagues could read
the index but not the weights). Outside a run folder: the umask's mode; inside one: the run
folder's (storage.share, hpctrain/kernel/rundir.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from test_export import cli as export

from hpctrain.kernel import jobenv

torch = pytest.importorskip("torch")


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A runtime-API run folder with one checkpoint of a two-tensor model."""
    from hpctrain import runtime

    folder = tmp_path / "own"
    monkeypatch.setenv(jobenv.RUN_DIR, str(folder))
    runtime.Checkpoint(folder / "checkpoints").save(
        1, {"model": {"w": torch.ones(3), "b": torch.ones(2)}}
    )
    return folder


def _modes(folder: Path) -> dict[str, str]:
    return {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in folder.iterdir()}


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_weights_have_the_mode_of_the_rest_of_the_export(run, tmp_path, fmt):
    """Two shards and their index (written by three different writers) under umask 022: 0644."""
    old = os.umask(0o022)
    try:
        res = export(
            str(run), "--format", fmt, "--max-shard-size", "12", "--out", str(tmp_path / "w")
        )
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    modes = _modes(tmp_path / "w")
    assert len(modes) == 3 and any(n.endswith(".index.json") for n in modes), modes
    assert set(modes.values()) == {"0o644"}, modes
    assert oct(stat.S_IMODE((tmp_path / "w").stat().st_mode)) == "0o755"


@pytest.mark.parametrize(("share_mode", "file_mode"), [(0o700, "0o600"), (0o750, "0o640")])
def test_an_export_inside_the_run_folder_follows_its_storage_share(run, share_mode, file_mode):
    """storage.share none (0700) / group (0750): every exported file 0600 / 0640, umask or not."""
    os.chmod(run, share_mode)
    old = os.umask(0o022)
    try:
        res = export(str(run), "--max-shard-size", "12")
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    (out,) = (run / "export").iterdir()
    modes = _modes(out)
    assert len(modes) == 3 and set(modes.values()) == {file_mode}, modes
