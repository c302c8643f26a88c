"""Faults in real runs: a full disk during a run ends in one line and resumes bit-identical; run
folders that are broken and names that must not be reused (the checkpointer on a full disk,
signals and prune: tests/test_faults.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from _faults_common import fill, hpctrain, wait_for
from click.testing import CliRunner

from hpctrain import dispatch
from hpctrain.cli import main
from hpctrain.runs.folder import RunDir

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


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
    # the run's end read in this process (a `status` is a Python start, ~0.5 s CPU: at 20 polls a
    # second it took a core from the tests beside), then `status` itself
    wait_for(lambda: dispatch.state(RunDir(run)) not in ("PENDING", "RUNNING"))
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
    from hpctrain.jobs.request import JobRequest
    from hpctrain.profiles import resolve
    from hpctrain.runs.folder import RunDir

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
    from hpctrain.runs.folder import RunDir
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
    from hpctrain.runs.folder import copy_aside, move_aside

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
