"""Faults (issue 15): a full disk during a run, pids that are no longer the run's, run folders that
are broken. Each is one clear line or a marked row, never a traceback, and never a lost run.

The disk is a small tmpfs mounted by the test as the runs folder (the tests run as root), filled by
the test: once with room for the logs but not the next checkpoint, once completely during training.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctrain.cli import main
from hpctrain.kernel import jobenv

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def hp_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(jobenv.PREFIX)}
    return env | {
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "OMP_NUM_THREADS": "1",
    }


def hpctrain(
    home: Path, *args: str, ok: bool | None = True, timeout: float = 300
) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        capture_output=True,
        text=True,
        env=hp_env(home),
        cwd=home,
        timeout=timeout,
    )
    assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    if ok is not None:
        assert (out.returncode == 0) == ok, (
            f"{args} -> {out.returncode}\n{out.stdout}\n{out.stderr}"
        )
    return out


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


def fill(folder: Path, leave: int = 0) -> Path:
    """Write a filler file until at most `leave` bytes are free."""
    filler = folder / "filler"
    with open(filler, "ab") as f:
        while (free := shutil.disk_usage(folder).free) > leave:
            try:
                f.write(b"\0" * min(1 << 20, max(4096, free - leave)))
                f.flush()
            except OSError:
                break
    return filler


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


# --- a full disk during a real run ----------------------------------------------------------------

TRAIN = ["--max-steps", "30", "--checkpoint-every", "10", "--model.d_model=128"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[str, int, Path]:
    """The uninterrupted run, submitted from a folder with a space in its path (that once ended
    LOST: the local executor split the script's path)."""
    home = tmp_path_factory.mktemp("reference") / "my runs"
    home.mkdir()
    hpctrain(
        home,
        "submit",
        "--profile",
        "local",
        "--nodes",
        "1",
        "--gpus",
        "2",
        "--name",
        "ref",
        "--wait",
        "--",
        *TRAIN,
    )
    run = home / "runs" / "ref"
    size = sum(
        p.stat().st_size for p in (run / "checkpoints" / "step-00000030").rglob("*") if p.is_file()
    )
    return (run / "final_params.sha256").read_text(), size, home


@pytest.fixture
def runs_tmpfs(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m,mode=0755", "tmpfs", str(runs)], check=True
    )
    try:
        yield runs
    finally:
        subprocess.run(["umount", "-l", str(runs)], check=False)


def wait_for(predicate, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def latest(run: Path) -> str | None:
    try:
        return (run / "checkpoints" / "latest").read_text().strip()
    except OSError:
        return None


@pytest.mark.parametrize("leave", ["room-for-logs", "nothing"])
def test_full_disk_ends_failed_in_one_line_and_resumes_bit_identical(
    tmp_path, runs_tmpfs, reference, leave
) -> None:
    ref_hash, ckpt_size, _ = reference
    run = runs_tmpfs / "full"
    hpctrain(
        tmp_path,
        "submit",
        "--profile",
        "local",
        "--nodes",
        "1",
        "--gpus",
        "2",
        "--name",
        "full",
        "--",
        *TRAIN,
    )
    wait_for(lambda: latest(run) == "step-00000010")
    filler = fill(runs_tmpfs, leave=ckpt_size // 3 if leave == "room-for-logs" else 0)
    if leave == "nothing":
        out = hpctrain(
            tmp_path, "submit", "--profile", "local", "--name", "other", "--dry-run", ok=False
        )
        assert "cannot write the run folder" in out.stderr and "no space left" in out.stderr
    wait_for(lambda: "FAILED" in hpctrain(tmp_path, "status", "full").stdout)
    status = hpctrain(tmp_path, "status", "full").stdout
    saved = latest(run)
    assert saved in ("step-00000010", "step-00000020")  # the last verified step
    assert (
        f"no space left in {runs_tmpfs}" in status
        and f"newest verified checkpoint: {saved}" in status
    )
    assert "fix: free space there, then `hpctrain resume full`" in status
    logs = "".join(p.read_text(errors="replace") for p in (run / "logs").glob("*.log"))
    # no traceback of ours (torchrun prints its own ChildFailedError for any failed worker)
    assert "OSError" not in logs and "RuntimeError" not in logs and "train_entry/" not in logs, (
        logs[-9000:]
    )
    if leave == "room-for-logs":  # the failed saves were reported and training went on to the end
        events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
        assert [e["step"] for e in events if e["event"] == "save_failed"][-1] == 30
        assert "training goes on" in (run / "train.log").read_text()
        assert sum("error: no space left in" in line for line in logs.splitlines()) == 1
    filler.unlink()
    hpctrain(tmp_path, "resume", "full", "--wait")
    assert (run / "final_params.sha256").read_text() == ref_hash


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
    from hpctrain.procs import start_time

    wait_for(lambda: start_time(other.pid) is not None, 10)
    try:
        yield run, other
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("recorded", ["same-start-wrong-command", "old-format"])
def test_cancel_and_preempt_never_signal_a_reused_pid(fake_run, recorded) -> None:
    from hpctrain.procs import start_time

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


# --- run folders that are broken, and names that must not be reused -------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def invoke(*args: str):
    out = CliRunner().invoke(main, list(args))
    assert "Traceback" not in out.output and out.exit_code in (0, 2), (
        out.exit_code,
        out.output,
        out.exception,
    )
    return out


def make_run(home: Path, name: str) -> Path:
    from hpctrain.profiles import resolve
    from hpctrain.request import JobRequest
    from hpctrain.runs import RunDir

    profile = resolve("local", {})
    run = RunDir(home / "runs" / name)
    run.create(profile=profile, request=JobRequest.build(profile, name=name), script="echo\n")
    return run.path


@pytest.mark.parametrize(
    "content",
    [
        b"- a\n- b\n",
        b"just text\n",
        b"\x00\x01\xff\xfe binary",
        b"a: [\n",
        b"profile: {scheduler: local}\n",
        b"request: 3\nprofile: {}\n",
        b"x: " + b"9" * 5000 + b"\n",
    ],
)
def test_a_broken_run_is_a_marked_row_not_a_crash(home, content) -> None:
    make_run(home, "good")
    bad = make_run(home, "bad")
    (bad / "run.yaml").write_bytes(content)
    rows = {r["name"]: r for r in json.loads(invoke("runs", "--json").output)}
    assert rows["good"]["state"] != "BROKEN" and rows["bad"]["state"] == "BROKEN"
    assert "run.yaml" in rows["bad"]["reason"]
    assert "bad: broken:" in invoke("runs").output
    assert "BROKEN" in invoke("status").output
    out = invoke("status", "bad")
    assert out.exit_code == 2 and "run.yaml" in out.output and "fix:" in out.output


def test_jobs_lines_without_job_id_and_manifests_that_are_lists(home) -> None:
    run = make_run(home, "j")
    (run / "jobs.jsonl").write_text(
        '{"job_id": "123", "kind": "submit"}\n{"kind": "resume"}\n[1]\n"x"\n'
        '{"job_id": "--user=me", "kind": "resume"}\n{"job_id": true}\n'
    )
    info = json.loads(invoke("status", "j", "--json").output)
    assert info["job_id"] == "123"
    ck = run / "checkpoints" / "step-00000005"
    ck.mkdir(parents=True)
    (ck / "MANIFEST.json").write_text("[1, 2, 3]")
    (run / "checkpoints" / "latest").write_text("step-00000005\n")
    from hpctrain.runs import RunDir
    from hpctrain.service.resume import newest_checkpoint as _newest_checkpoint

    assert _newest_checkpoint(RunDir(run)) is None  # what resume starts from: not the list
    assert json.loads(invoke("status", "j", "--json").output)["state"] != "BROKEN"


def test_runs_dir_that_is_a_file_a_loop_or_read_only(home) -> None:
    (home / "afile").write_text("x")
    out = invoke(
        "submit",
        "--profile",
        "local",
        "--name",
        "x",
        "--dry-run",
        "--set",
        f"storage.runs_dir={home}/afile",
    )
    assert (
        out.exit_code == 2
        and "cannot write the run folder" in out.output
        and "not a folder" in out.output
    )
    out = invoke(
        "submit", "--profile", "local", "--name", "x", "--set", f"storage.runs_dir={home}/afile"
    )
    assert out.exit_code == 2 and "not a folder" in out.output
    (home / "loop").symlink_to(home / "loop")
    out = invoke(
        "submit",
        "--profile",
        "local",
        "--name",
        "x",
        "--dry-run",
        "--set",
        f"storage.runs_dir={home}/loop",
    )
    assert out.exit_code == 2 and "symlink loop" in out.output
    ro = home / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(ro)], check=True)
    try:
        out = invoke(
            "submit",
            "--profile",
            "local",
            "--name",
            "x",
            "--dry-run",
            "--set",
            f"storage.runs_dir={ro}",
        )
        assert out.exit_code == 2 and "not writable" in out.output
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)
    (home / "runs").mkdir(exist_ok=True)
    (home / "runs" / "dangling").symlink_to(home / "nowhere")
    out = invoke("submit", "--profile", "local", "--name", "dangling", "--dry-run")
    assert out.exit_code == 2 and "not a run folder" in out.output
    assert invoke("runs").exit_code == 0


def test_names_moved_aside_are_never_overwritten(home) -> None:
    from hpctrain.runs import copy_aside, move_aside

    run = make_run(home, "r")
    (home / "runs" / "r.old-X").mkdir()  # an empty folder: rename(2) would replace it
    aside = move_aside(run, "r.old-X")
    assert (
        aside.name == "r.old-X-2"
        and (aside / "run.yaml").is_file()
        and (home / "runs" / "r.old-X").is_dir()
    )
    first = copy_aside(aside / "job.sh", "job.sh.before-resume-T")
    (aside / "job.sh").write_text("changed\n")
    second = copy_aside(aside / "job.sh", "job.sh.before-resume-T")
    assert first.read_text() == "echo\n" and second.read_text() == "changed\n" and first != second


def test_local_submit_from_a_folder_with_a_space(reference) -> None:
    ref_hash, _, home = reference
    assert " " in str(home) and "COMPLETED" in hpctrain(home, "status", "ref").stdout


@pytest.mark.parametrize(
    "args, expect",
    [
        (["--nodes", str(10**24)], "not a realistic value"),
        (["--nodes", "1000", "--gpus", "8"], "local workers, more than"),
        (["--time", str(10**12)], "not a realistic value"),
    ],
)
def test_absurd_local_topology_is_capped_by_the_machine(home, args, expect) -> None:
    out = invoke("submit", "--profile", "local", "--name", "big", "--dry-run", *args)
    assert out.exit_code == 2 and expect in out.output


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
    by the 10-SIGKILL resume test); the stand-in rmtree deletes one file, then 'dies'."""
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

    def dies_half_way(path, *a, **k):
        victim = next(
            p for p in sorted(Path(path).rglob("*")) if p.is_file() and p.name != "MANIFEST.json"
        )
        victim.unlink()
        raise Killed

    monkeypatch.setattr(real_shutil, "rmtree", dies_half_way)
    state.step = 3
    with pytest.raises(Killed):
        ckpt.maybe_save(state)  # commits step 3, then prunes step 1 and "dies"
    monkeypatch.setattr(real_shutil, "rmtree", rmtree)
    ck = tmp_path / "run" / "checkpoints"
    for folder in ck.glob("step-*"):
        assert verify(folder)[1] is None, folder
    state.step = 4
    ckpt.maybe_save(state)  # the next prune finishes the half-deleted one
    assert not list(ck.glob(".pruning-*"))
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-00000003", "step-00000004"]
