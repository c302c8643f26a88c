"""Faults (issue 15): a full disk during a run, pids that are no longer the run's, run folders that
are broken. Each is one clear line or a marked row, never a traceback, and never a lost run.

The disk is a small tmpfs mounted by the test as the runs folder (the tests run as root), filled by
the test: once with room for the logs but not the next checkpoint, once completely during training."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from _faults_common import fill, wait_for
from click.testing import CliRunner

from hpctrain.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


# --- the checkpointer on a full disk, in one process ----------------------------------------------


@pytest.fixture
def tmpfs(tmp_path):
    """A 4 MiB tmpfs; umounted whatever happens."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "tmpfs", str(mnt)], check=True
    )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_failed_save_raises_on_every_rank_and_keeps_the_previous_checkpoint(tmpfs) -> None:
    import torch

    from train_entry.checkpoint import Checkpointer, SaveFailed, newest_verified
    from train_entry.state import TrainState

    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.AdamW(model.parameters())
    state = TrainState(model=model, optimizer=opt, scheduler=None, data={}, config={})
    ckpt = Checkpointer(tmpfs / "run", strategy="ddp", every_steps=1, log=lambda m: None)
    state.step = 1
    ckpt.maybe_save(state)
    filler = fill(tmpfs, leave=64 * 1024)  # room for a log line, not a checkpoint
    state.step = 2
    with pytest.raises(SaveFailed) as e:
        ckpt.maybe_save(state)
    assert e.value.no_space and e.value.step == 2
    ck = tmpfs / "run" / "checkpoints"
    assert (ck / "latest").read_text() == "step-00000001\n"
    assert not list(ck.glob(".staging-*")) and not list(
        ck.glob(".latest.tmp*")
    )  # its space is back
    assert newest_verified(ck)[0].name == "step-00000001"
    filler.unlink()
    state.step = 3  # the next interval saves again
    assert ckpt.maybe_save(state)
    assert (ck / "latest").read_text() == "step-00000003\n"


def test_verification_reads_only_regular_files_inside_the_checkpoint(tmp_path) -> None:
    from train_entry.checkpoint import verify

    folder = tmp_path / "step-00000001"
    folder.mkdir()
    (tmp_path / "outside").write_text("x")
    (folder / "link").symlink_to(tmp_path / "outside")
    cases = {
        "/dev/zero": "outside",
        "../outside": "outside",
        "link": "outside",
        "/etc/passwd": "outside",
    }
    for rel, why in cases.items():
        (folder / "MANIFEST.json").write_text(
            json.dumps({"files": {rel: {"size": 1, "sha256": "0"}}})
        )
        manifest, reason = verify(folder)
        assert manifest is None and why in reason, (rel, reason)
    os.mkfifo(folder / "fifo")
    (folder / "MANIFEST.json").write_text(
        json.dumps({"files": {"fifo": {"size": 0, "sha256": "0"}}})
    )
    assert "not a regular file" in verify(folder)[1]
    for bad in ("[1, 2]", '"x"', '{"files": {"a": 3}}'):
        (folder / "MANIFEST.json").write_text(bad)
        assert verify(folder)[0] is None


# --- cancel and preempt signal only the run's own process -----------------------------------------


@pytest.fixture
def fake_run(tmp_path, monkeypatch):
    """A run folder whose state.json names an unrelated process (a reused pid)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "victim"
    (run / "logs").mkdir(parents=True)
    (run / "run.yaml").write_text(
        "profile: {name: local, scheduler: local}\nrequest: {nodes: 1, gpus: 1}\n"
    )
    (run / "job.sh").write_text("#!/bin/bash\n")
    (run / "jobs.jsonl").write_text(
        json.dumps({"job_id": "1", "kind": "submit", "scheduler": "local"}) + "\n"
    )
    other = subprocess.Popen(["setsid", "sleep", "60"])
    from hpctrain.runs.procs import start_time

    wait_for(lambda: start_time(other.pid) is not None, 10)
    try:
        yield run, other
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("recorded", ["same-start-wrong-command", "old-format"])
def test_cancel_and_preempt_never_signal_a_reused_pid(fake_run, recorded) -> None:
    from hpctrain.runs.procs import start_time

    run, other = fake_run
    st = {"state": "RUNNING", "pid": other.pid, "pgid": other.pid, "exit_code": None}
    if recorded == "same-start-wrong-command":
        st |= {"start": start_time(other.pid), "token": "ab" * 16}
    (run / "state.json").write_text(json.dumps(st))
    runner = CliRunner()
    out = runner.invoke(main, ["preempt", "victim"])
    assert out.exit_code in (0, 2) and "Traceback" not in out.output
    out = runner.invoke(main, ["cancel", "victim"])
    assert out.exit_code == 0, out.output
    time.sleep(0.3)
    assert other.poll() is None, "an unrelated process was signalled"
    status = runner.invoke(main, ["status", "victim"]).output
    assert ("LOST" in status) == (recorded != "old-format")


@pytest.mark.parametrize("sig", ["KILL", "STOP", "SEGV", "9", "CHLD"])
def test_preempt_accepts_only_documented_signals(fake_run, sig) -> None:
    out = CliRunner().invoke(main, ["preempt", "victim", "--signal", sig])
    assert (
        out.exit_code == 2
        and "USR2, USR1, HUP, INT, URG or TERM" in out.output.replace(", TERM", " or TERM")
        or "use one of USR2" in out.output
    ), out.output
    assert fake_run[1].poll() is None


def test_a_failed_async_save_is_reported_at_wait_and_retried(tmpfs) -> None:
    import torch

    from train_entry.checkpoint import Checkpointer, SaveFailed
    from train_entry.state import TrainState

    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    state = TrainState(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters()),
        scheduler=None,
        data={},
        config={},
    )
    ckpt = Checkpointer(
        tmpfs / "run", strategy="ddp", every_steps=1, async_save=True, log=lambda m: None
    )
    state.step = 1
    ckpt.maybe_save(state)
    ckpt.wait()
    filler = fill(tmpfs, leave=64 * 1024)
    state.step = 2
    ckpt.maybe_save(state)  # staged; the write fails in the background
    with pytest.raises(SaveFailed) as e:
        ckpt.wait()
    assert e.value.step == 2 and e.value.no_space
    ck = tmpfs / "run" / "checkpoints"
    assert (ck / "latest").read_text() == "step-00000001\n" and not list(ck.glob(".staging-*"))
    filler.unlink()
    assert ckpt.maybe_save(state)  # the same step is tried again once there is room
    ckpt.wait()
    assert (ck / "latest").read_text() == "step-00000002\n"


def test_a_prune_killed_half_way_never_leaves_a_damaged_step_folder(tmp_path, monkeypatch) -> None:
    """SIGKILL during the pruning rmtree left step-N with its MANIFEST but not all its files (seen
    by the 10-SIGKILL resume test); the stand-in rmtree deletes one file, then 'dies' (the delete
    runs on the prune's thread, which wait() joins)."""
    import shutil as real_shutil

    import torch

    from train_entry.checkpoint import Checkpointer, verify
    from train_entry.state import TrainState

    class Killed(BaseException):
        pass

    model = torch.nn.Linear(8, 8)
    state = TrainState(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters()),
        scheduler=None,
        data={},
        config={},
    )
    ckpt = Checkpointer(tmp_path / "run", strategy="ddp", every_steps=1, keep=2, log=lambda m: None)
    for step in (1, 2):
        state.step = step
        ckpt.maybe_save(state)
    rmtree = real_shutil.rmtree

    died = []

    def dies_half_way(path, *a, **k):
        victim = next(
            p for p in sorted(Path(path).rglob("*")) if p.is_file() and p.name != "MANIFEST.json"
        )
        victim.unlink()
        died.append(path)
        raise Killed

    monkeypatch.setattr(real_shutil, "rmtree", dies_half_way)
    state.step = 3
    ckpt.maybe_save(state)  # commits step 3, then prunes step 1 and "dies"
    ckpt.wait()
    assert died
    monkeypatch.setattr(real_shutil, "rmtree", rmtree)
    ck = tmp_path / "run" / "checkpoints"
    for folder in ck.glob("step-*"):
        assert verify(folder)[1] is None, folder
    state.step = 4
    ckpt.maybe_save(state)  # the next prune finishes the half-deleted one
    ckpt.wait()
    assert not list(ck.glob(".pruning-*"))
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-00000003", "step-00000004"]
