"""Sweeps (`hpctrain sweep`): one run folder per grid point; on Slurm one job array whose preempted
element requeues alone; locally the points run K at a time through the local executor."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _events import kinds
from _hold import held
from _squeue import queued

HPCTRAIN = [sys.executable, "-m", "hpctrain"]
TINY = ["--train.micro_batch=4", "--train.global_batch=8", "--train.log_every=1"]


@pytest.fixture
def hp(tmp_path):
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "OMP_NUM_THREADS": "1",
    }

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [*HPCTRAIN, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        if check:
            assert out.returncode == 0, f"{args} -> {out.returncode}\n{out.stdout}\n{out.stderr}"
        return out

    run.root = tmp_path
    run.env = env
    return run


def lines(path: Path) -> list[dict]:
    return (
        [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if path.is_file()
        else []
    )


def dump(run: Path) -> str:
    """A point's events and log tails, for a failure message."""
    out = []
    for f in [run / "events.jsonl", run / "restarts.jsonl", *sorted((run / "logs").glob("*.log"))]:
        if f.is_file():
            tail = f.read_text(errors="replace").splitlines()[-15:]
            out.append(f"==> {f.name} <==\n" + "\n".join(tail))
    return "\n".join(out)


def until(what: str, cond, timeout: float, every: float = 1.0):
    start = time.monotonic()
    while not (value := cond()):
        assert time.monotonic() < start + timeout, f"not within {timeout} s: {what}"
        time.sleep(every)
    print(f"until: {what}: {time.monotonic() - start:.1f} s")  # the figures behind the timeouts
    return value


def test_dry_run_prints_the_grid_and_the_array_script_and_bad_grids_say_how(hp):
    out = hp(
        "sweep",
        "--profile",
        "loopback",
        "--name",
        "g",
        "--grid",
        "optim.lr=1e-3,1e-2",
        "--grid",
        "train.seed=1,2,3",
        "--max-parallel",
        "2",
        "--dry-run",
        "--",
        "--max-steps=5",
    )
    assert "sweep g: 6 points on one Slurm job array" in out.stdout, out.stdout
    assert re.search(
        r"^5\s+5-optim\.lr=1e-2,train\.seed=3\s+--optim\.lr=1e-2 --train\.seed=3$", out.stdout, re.M
    ), out.stdout
    script = out.stdout.split("<==\n", 1)[1].rsplit("nothing was written", 1)[0]
    assert "#SBATCH --array=0-5%2" in script and "#SBATCH --job-name=g" in script
    assert "#SBATCH --requeue" in script and 'exec bash "$point/job.sh"' in script
    assert not (hp.root / "runs").exists()
    if shutil.which("shellcheck"):
        check = subprocess.run(
            ["shellcheck", "-S", "warning", "-"], input=script, text=True, capture_output=True
        )
        assert check.returncode == 0, check.stdout
    # every point's train_entry config is checked before anything is written
    out = hp(
        "sweep", "--profile", "loopback", "--name", "g", "--grid", "optim.lrr=1,2", check=False
    )
    assert out.returncode == 2 and "point 0-optim.lrr=1:" in out.stderr, out.stderr
    assert "did you mean 'optim.lr'" in out.stderr and not (hp.root / "runs").exists()
    for grid, msg in (
        ("lr", "write KEY=V1,V2"),
        ("lr=a/b", "characters a folder name cannot"),
        ("--optim.lr=1,2", None),
    ):
        out = hp(
            "sweep",
            "--profile",
            "loopback",
            "--name",
            "g",
            "--grid",
            grid,
            "--dry-run",
            check=msg is None,
        )
        if msg:
            assert out.returncode == 2 and msg in out.stderr and "Traceback" not in out.stderr


def test_local_sweep_one_point_at_a_time_cancel_and_resume_by_sweep_name(hp):
    out = hp(
        "sweep",
        "--profile",
        "local",
        "--name",
        "loc",
        "--nodes",
        "1",
        "--gpus",
        "1",
        "--grid",
        "optim.lr=1e-3,3e-3",
        "--",
        *TINY,
        "--max-steps=96",  # ~2 s of training: room for the cancel to land mid-run
        "--checkpoint-every=32",
    )
    assert "2 points on this machine, 1 at a time" in out.stdout, out.stdout
    sweep = hp.root / "runs" / "loc"
    first, second = sweep / "0-optim.lr=1e-3", sweep / "1-optim.lr=3e-3"

    def status() -> dict:
        return json.loads(hp("status", "loc", "--json").stdout)

    try:
        deadline = time.monotonic() + 120
        while len(lines(first / "metrics.jsonl")) < 2:  # polled fast: the point trains ~2 s
            assert time.monotonic() < deadline, "point 0 never trained"
            time.sleep(0.02)
        # the runner stops; the running point saves and stops. Its ranks are held until the
        # batch shell has the cancel (a fresh-clone CI run once saw point 0 finish first)
        with held(first):
            cancel = subprocess.Popen(
                [*HPCTRAIN, "cancel", "loc"], cwd=hp.root, env=hp.env, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            until("the cancel reaches point 0", lambda: (first / "STOP").exists(), 60)
        said, err = cancel.communicate(timeout=120)
        assert cancel.returncode == 0, err
        assert "sweep loc: 1 point(s) cancelled" in said, said
        rows = until(
            "point 0 ends", lambda: (t := status())["points"][0]["state"] != "RUNNING" and t, 90
        )["points"]
        assert [r["state"] for r in rows] == ["CANCELLED", "WAITING"], rows
        assert not (second / "jobs.jsonl").exists()  # never started

        out = hp("resume", "loc")
        assert "sweep loc: 2 point(s) to run again, 1 at a time" in out.stdout, out.stdout

        def ended() -> dict | None:
            t = status()
            return t if all(r["state"] in ("COMPLETED", "FAILED") for r in t["points"]) else None

        rows = until("both points end", ended, 180)["points"]
    except AssertionError:
        print((sweep / "logs" / "runner.log").read_text(), dump(first), dump(second))
        raise
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED"], rows
    assert all(isinstance(r["final_loss"], float) for r in rows)
    assert rows[0]["final_loss"] != rows[1]["final_loss"]  # the grid reached the entry
    assert (first / "run.yaml").is_file() and (second / "job.sh").is_file()  # each its own
    # point 0 resumed from the checkpoint its cancel saved; point 1 started after it was done
    starts = re.findall(r"step (\d+)/96\n", (first / "train.log").read_text())
    assert len(starts) == 2 and starts[0] == "0" and int(starts[1]) > 0, starts
    done = [e["time"] for e in lines(first / "events.jsonl") if e["event"] == "done"]
    assert done and lines(second / "restarts.jsonl")[0]["time"] >= done[-1]
    table = hp("runs").stdout
    assert re.search(r"sweep loc .*\n.*\n.*\n0\s+0-optim\.lr=1e-3\s+COMPLETED", table), table
    assert "done: 96 steps" in hp("logs", "loc/1", "--rank", "0").stdout
    report = json.loads(hp("report", "loc", "--json").stdout)
    assert [p["final_loss"] for p in report["points"]] == [r["final_loss"] for r in rows]


@pytest.mark.slurm
@pytest.mark.timeout(1800)  # the waits below, summed, and the CLI calls
def test_array_element_preempted_requeues_alone_and_resume_sweep_is_one_array(slurm_cluster, hp):
    """A 3-point array: point 0 is preempted and requeues alone; point 1 is cancelled mid-training
    and point 2 before it starts. `resume arr` then submits ONE job array of exactly indexes 1,2;
    point 1 resumes from its own checkpoint, point 2 starts, point 0 is not touched."""
    train = [
        *TINY,
        "--model.d_model=128",
        "--model.n_layers=4",
        "--model.seq_len=64",
        "--max-steps=60",
        "--checkpoint-every=10",
    ]
    out = hp(
        "sweep",
        "--profile",
        "loopback",
        "--name",
        "arr",
        "--nodes",
        "2",
        "--gpus",
        "1",
        "--grid",
        "optim.lr=1e-3,3e-3,1e-2",
        "--",
        *train,
    )
    array = re.search(r"array job (\d+)", out.stdout).group(1)
    sweep = hp.root / "runs" / "arr"
    pts = [sweep / "0-optim.lr=1e-3", sweep / "1-optim.lr=3e-3", sweep / "2-optim.lr=1e-2"]
    first, second, third = pts
    again = None

    def table() -> dict:
        return json.loads(hp("status", "arr", "--json").stdout)

    asked = [0.0]

    def ended() -> dict | None:
        # a `status` is a Python start (~0.5 s CPU): asked once no task is queued, or every 15 s
        if queued([j for j in (array, again) if j]) and time.monotonic() - asked[0] < 15:
            return None
        asked[0] = time.monotonic()
        t = table()
        ends = ("COMPLETED", "FAILED", "CANCELLED", "PREEMPTED")
        return t if all(r["state"] in ends for r in t["points"]) else None

    try:
        assert [lines(p / "jobs.jsonl")[0]["job_id"] for p in pts] == [
            f"{array}_{i}" for i in range(3)
        ]
        # two points fit on the two nodes at once: point 2 waits, and is cancelled before it starts
        hp("cancel", "arr/2")
        # each point is held still the moment it is ready, whichever starts first (under load point 1
        # once trained all 60 steps while the test waited for point 0), so the stops land mid-run.
        # Point 1 is held once its step-10 checkpoint is committed: a cancel is Slurm's TERM, then
        # KILL after KillWait (5 s here), and under CI's load a first save once did not fit in it.
        with contextlib.ExitStack() as stack:
            ready = {first: lambda: len(lines(first / "metrics.jsonl")) >= 3}
            ready[second] = lambda: len(lines(second / "saves.jsonl")) >= 1
            waiting = [first, second]

            def both_train() -> bool:
                for p in list(waiting):
                    if ready[p]():
                        stack.enter_context(held(p))
                        waiting.remove(p)
                return not waiting

            try:
                # 38-101 s at load 19-22 (2 CPU hogs and other work on 2 cores); quiet: ~10 s
                until("both points train", both_train, 480, every=0.1)
            except AssertionError:
                queue = subprocess.run(["squeue"], capture_output=True, text=True).stdout
                raise AssertionError(
                    f"{[p.name for p in waiting]} did not train in 480 s\n{queue}\n"
                    + "\n".join(dump(p) for p in waiting)
                ) from None
            assert f"job {array}_0" in hp("preempt", "arr/0").stdout
            hp("cancel", "arr/1")  # TERM: it saves at the next step boundary and stops
        rows = until("every point ends", ended, 480)["points"]
        assert [r["state"] for r in rows] == ["COMPLETED", "CANCELLED", "CANCELLED"], "\n".join(
            dump(p) for p in pts
        )
        assert not (third / "restarts.jsonl").exists()  # never started
        saved = rows[1]["checkpoint_step"]
        assert saved and 10 <= saved < 60, f"{rows[1]}\n{dump(second)}"
        # only the preempted task was requeued: its own restarts, the other task ran once
        assert [r["restart_count"] for r in lines(first / "restarts.jsonl")] == [0, 1]
        assert [r["restart_count"] for r in lines(second / "restarts.jsonl")] == [0]
        names = kinds(lines(first / "events.jsonl"))
        assert names[:3] == ["signal", "preempted", "requeue"] and names[-1] == "done", names
        starts = re.findall(r"step (\d+)/60\n", (first / "train.log").read_text())
        assert len(starts) == 2 and starts[0] == "0" and int(starts[1]) > 0, starts
        sacct = subprocess.run(
            ["sacct", "-X", "-D", "-n", "-P", "-j", array, "-o", "JobID,State"],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert f"{array}_0|REQUEUED" in sacct and sacct.count(f"{array}_0|COMPLETED") == 1, sacct

        # resume SWEEP: the unfinished points only, as one job array
        before = [len(lines(p / "jobs.jsonl")) for p in pts]
        out = hp("resume", "arr", "--dry-run")
        assert "2 point(s), one job array: #SBATCH --array=1,2" in out.stdout, out.stdout
        assert f"1-optim.lr=3e-3 (CANCELLED): from step-{saved:08d}" in out.stdout, out.stdout
        assert "0-optim" not in out.stdout and "nothing was written" in out.stdout
        assert [len(lines(p / "jobs.jsonl")) for p in pts] == before
        out = hp("resume", "arr")
        again = re.search(r"resumed as array job (\d+) \(#SBATCH --array=1,2\)", out.stdout)
        assert again, out.stdout
        again = again.group(1)
        assert "#SBATCH --array=1,2\n" in (sweep / "array.sh").read_text()
        assert [lines(p / "jobs.jsonl")[-1]["job_id"] for p in pts] == [
            f"{array}_0",
            f"{again}_1",
            f"{again}_2",
        ]
        assert len(lines(first / "jobs.jsonl")) == before[0]  # the finished point: untouched
        rows = until("the resumed points end", ended, 480)["points"]
        assert [r["state"] for r in rows] == ["COMPLETED"] * 3, "\n".join(dump(p) for p in pts)
        tasks = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-j", again, "-o", "JobID,State"],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert sorted(tasks) == [f"{again}_1|COMPLETED", f"{again}_2|COMPLETED"], tasks
        # point 1 went on from its own checkpoint; point 2 started from the beginning
        starts = re.findall(r"step (\d+)/60\n", (second / "train.log").read_text())
        assert starts == ["0", str(saved)], starts
        assert re.findall(r"step (\d+)/60\n", (third / "train.log").read_text()) == ["0"]
        assert [r["restart_count"] for r in lines(first / "restarts.jsonl")] == [0, 1]
        resumed = [e for e in lines(second / "events.jsonl") if e["event"] == "resume"]
        assert [(e["job_id"], e["from_checkpoint"]) for e in resumed] == [
            (f"{again}_1", f"step-{saved:08d}")
        ]
    finally:
        subprocess.run(["scancel", array, *([again] if again else [])], capture_output=True)


def test_resume_array_line_names_only_the_given_points_and_keeps_max_parallel():
    from hpctrain.service.sweep import array_spec, resume_spec

    assert resume_spec([4, 1, 3], 2) == "1,3,4%2" and resume_spec([2], None) == "2"
    assert array_spec(6, 3) == "0-5%3"
