"""Why a run failed (hpctrain/runs/cause.py): the rank and node that failed first and how, over
run folders laid out as torchrun, srun, train_entry and the batch script write them; and live on
the local profile: SIGKILL of rank 3 of 2 nodes x 2, and `status` names rank 3 and signal 9.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from test_parallel_layouts import Home

from hpctrain.kernel import failures, jobenv
from hpctrain.runs.cause import root_cause
from train_entry import cli

T0 = 1_800_000_000.0  # the failures' clock


def block(*failed: tuple[int, int, float], host: str = "n1") -> str:
    """torchrun's ChildFailedError text: (rank, exitcode, time) each, the first the root cause."""

    def entry(i: int, rank: int, code: int, t: float) -> str:
        stamp = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(t))
        sig = f" ({signal.Signals(-code).name})" if code < 0 else ""
        why = f"Signal {-code}{sig[1:]} received by PID 7{rank}" if code < 0 else "To enable ..."
        return (
            f"[{i}]:\n  time      : {stamp}\n  host      : {host}\n"
            f"  rank      : {rank} (local_rank: {rank % 2})\n"
            f"  exitcode  : {code} (pid: 7{rank}) {sig}\n  error_file: <N/A>\n  traceback : {why}\n"
        )

    root, *others = failed
    return (
        "Traceback (most recent call last):\n"
        '  File ".../torch/distributed/run.py", line 1019, in run\n'
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        + "=" * 60
        + "\ntrain_entry FAILED\n"
        + "-" * 60
        + "\nFailures:\n"
        + ("".join(entry(i + 1, *o) for i, o in enumerate(others)) or "  <NO_OTHER_FAILURES>\n")
        + "-" * 60
        + "\nRoot Cause (first observed failure):\n"
        + entry(0, *root)
        + "=" * 60
        + "\n"
    )


def header(node: int, host: str, restart: int = 0, task: int | None = None) -> str:
    who = f"node {node}" + (f" task {task} (local {task % 2})" if task is not None else "")
    return f"hpctrain: {who} on {host} device=cpu gpu=none restart={restart} endpoint=x:1\n"


def traceback_of(rank: int, line: str) -> str:
    return (
        f"[rank{rank}]: Traceback (most recent call last):\n"
        f'[rank{rank}]:   File "train.py", line 9, in step\n[rank{rank}]: {line}\n'
    )


def folder(tmp_path: Path, job: str = "7", restart: int = 0, **logs: str) -> Path:
    (tmp_path / "logs").mkdir()
    for name, text in logs.items():
        (tmp_path / "logs" / f"{name.replace('_', '-')}.log").write_text(text)
    start = {"time": "2027-01-15T08:00:00Z", "job_id": job, "restart_count": restart}
    (tmp_path / "restarts.jsonl").write_text(json.dumps(start) + "\n")
    return tmp_path


def record(run: Path, rank: int, error: str, t: float, node: int, job: str = "7") -> None:
    env = {jobenv.JOB_ID: job, jobenv.RESTART_COUNT: "0", jobenv.NODEID: str(node)}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.setattr(time, "time", lambda: t)
        failures.record(run, rank, error)


LOST = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4242"


def test_sigkill_of_rank_3_on_the_second_node_not_rank_0_that_lost_it(tmp_path):
    # what the 2-node cluster recorded: rank 3 killed; rank 0 and 1 die of the lost peer, in the
    # same second, and node 0's torchrun names its own rank 0 (node-0.log comes first)
    run = folder(
        tmp_path,
        node_0=header(0, "n1") + traceback_of(0, LOST) + block((0, 1, T0), (1, 1, T0)),
        node_1=header(1, "n2") + block((3, -9, T0), host="n2"),
    )
    record(run, 0, LOST, T0 + 0.2, node=0)
    record(run, 1, LOST, T0 + 0.21, node=0)
    cause = root_cause(run)
    assert cause.line == "rank 3 on n2 was killed by signal 9 (SIGKILL)", cause
    got = (cause.rank, cause.node, cause.host, cause.kind, cause.signal)
    assert got == (3, 1, "n2", "signal", 9)
    assert cause.log == str(run / "logs" / "node-1.log")


def test_the_lost_peer_wins_nothing_even_without_records_or_a_later_time(tmp_path):
    # a user script (no records): rank 0's traceback says it only lost a peer, a second earlier
    run = folder(
        tmp_path,
        node_0=header(0, "n1") + traceback_of(0, LOST) + block((0, 1, T0 - 1)),
        node_1=header(1, "n2") + block((3, -9, T0), host="n2"),
    )
    assert root_cause(run).rank == 3


def test_a_user_exception_on_rank_2(tmp_path):
    err = "ValueError: batch 17 has no tokens"
    run = folder(
        tmp_path,
        node_0=header(0, "n1") + traceback_of(0, LOST) + block((0, 1, T0), (1, 1, T0)),
        node_1=header(1, "n2") + traceback_of(2, err) + block((2, 1, T0), host="n2"),
    )
    record(run, 2, err, T0 + 0.1, node=1)
    record(run, 0, LOST, T0 + 0.3, node=0)
    cause = root_cause(run)
    assert cause.line == f"rank 2 on n2: {err}", cause
    assert (cause.kind, cause.error, cause.log) == (
        "exception",
        err,
        str(run / "logs" / "node-1.log"),
    )


def test_the_earliest_of_two_own_failures(tmp_path):
    run = folder(tmp_path, node_0=header(0, "n1") + block((0, 1, T0), (1, 1, T0)))
    record(run, 1, "KeyError: 'b'", T0 + 0.1, node=0)
    record(run, 0, "KeyError: 'a'", T0 + 0.5, node=0)
    assert root_cause(run).rank == 1


def test_an_exit_code_without_an_exception(tmp_path):
    run = folder(
        tmp_path,
        node_0=header(0, "n1") + traceback_of(0, LOST) + block((0, 1, T0)),
        node_1=header(1, "n2") + "step 40/60 loss 2.1\n" + block((3, 3, T0), host="n2"),
    )
    cause = root_cause(run)
    assert cause.line == "rank 3 on n2 exited with code 3 (no Python exception in its output)"
    assert (cause.kind, cause.exit_code) == ("exit", 3)


def test_an_earlier_start_of_the_node_log_does_not_count(tmp_path):
    old = header(0, "n1") + traceback_of(1, "ValueError: old") + block((1, 1, T0 - 900))
    run = folder(tmp_path, node_0=old + header(0, "n1", restart=1) + block((0, -11, T0)))
    (run / "restarts.jsonl").write_text(json.dumps({"job_id": "7", "restart_count": 1}) + "\n")
    assert root_cause(run).line == "rank 0 on n1 was killed by signal 11 (SIGSEGV)"


def test_srun_launcher_reads_srun_task_lines_from_this_start(tmp_path):
    batch = (
        "hpctrain: start of job 7 restart 0 on n1\n"
        "srun: error: n1: task 0: Killed\n"  # an earlier start: not this one
        "hpctrain: start of job 7 restart 1 on n1\n"
        "srun: error: n1: task 0: Exited with exit code 1\n"  # lost its peer (record below)
        "srun: error: n2: task 3: Killed\n"
        "srun: launch/slurm: _step_signal: Terminating StepId=7.0\n"
        "slurmstepd-n1: error: *** STEP 7.0 ON n1 CANCELLED AT 2027-01-15T08:01:00 ***\n"
        "srun: error: n2: task 2: Killed\n"  # srun's own kill of the step, after rank 3
        "srun: error: n1: task 1: Terminated\n"
    )
    heads = header(0, "n1", 1, task=0) + header(0, "n1", 1, task=1)
    run = folder(
        tmp_path,
        batch=batch,
        node_0=heads + traceback_of(0, LOST),
        node_1=header(1, "n2", 1, task=2) + header(1, "n2", 1, task=3),
        restart=1,
    )
    where = run / failures.folder("7", 1)
    where.mkdir(parents=True)
    rec = {"rank": 0, "node": 0, "host": "n1", "time": T0, "error": LOST, "lost_peer": True}
    (where / "rank-0.json").write_text(json.dumps(rec))
    cause = root_cause(run)
    assert cause.line == "rank 3 on n2 was killed by signal 9 (SIGKILL)", cause
    assert cause.log == str(run / "logs" / "batch.log")


def test_under_torchrun_srun_task_lines_are_nodes_not_ranks(tmp_path):
    run = folder(
        tmp_path,
        batch="hpctrain: start of job 7 restart 0 on n1\nsrun: error: n2: task 1: Killed\n",
        node_0=header(0, "n1") + block((0, 1, T0)),
    )
    assert root_cause(run).rank == 0


def test_a_setup_failure_event_still_wins(tmp_path):
    run = folder(tmp_path, node_1=header(1, "n2") + block((3, -9, T0), host="n2"))
    (run / "events.jsonl").write_text(
        json.dumps({"event": "failed", "reason": "cannot activate the profile's venv"}) + "\n"
    )
    assert root_cause(run).to_json() == {
        "kind": "setup",
        "line": "cannot activate the profile's venv",
        "log": str(run / "logs" / "batch.log"),
    }


def test_train_entrys_config_error_line_wins(tmp_path):
    err = "error: train.global_batch(16) is not divisible by ..."
    run = folder(tmp_path, node_0=header(0, "n1") + f"[default0]:{err}\n" + block((0, 2, T0)))
    assert root_cause(run).line == err


def test_a_preempted_exit_is_no_failure_and_nothing_found_is_none(tmp_path):
    run = folder(tmp_path, node_0=header(0, "n1") + block((0, 75, T0), (1, 75, T0)))
    assert root_cause(run) is None


def test_train_entry_writes_its_record(tmp_path, monkeypatch):
    monkeypatch.setenv(jobenv.JOB_ID, "9")
    monkeypatch.setenv(jobenv.RESTART_COUNT, "2")
    monkeypatch.setenv("RANK", "1")
    cli._record(str(tmp_path), RuntimeError("x\nConnection reset by peer"))
    cli._record(str(tmp_path), ValueError("d_model must be even\nsecond line"))
    rec = json.loads((tmp_path / "failures" / "9-2" / "rank-1.json").read_text())
    assert (rec["rank"], rec["error"], rec["lost_peer"]) == (
        1,
        "ValueError: d_model must be even",
        False,
    )


# ---------------------------------------------------------------- live, on the local profile
def rank_pid(run: Path, rank: int) -> int | None:
    """The training process of `rank` (not torchrun, not the batch shell): its environment says."""
    want = {f"{jobenv.RUN_DIR}={run}".encode(), f"RANK={rank}".encode()}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = set((proc / "environ").read_bytes().split(b"\0"))
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if want <= env and b"train_entry" in cmd and b"hpctrain.launchers.rdzv" not in cmd:
            return int(proc.name)
    return None


def until(what: str, cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_live_sigkill_of_rank_3_is_named_by_status(tmp_path):
    home = Home(tmp_path)
    home.hp(
        # no in-job restart: the job must end, and status say why
        "submit", "--profile", "local", "--set", "preemption.max_in_job_restarts=0",
        "--nodes", "2", "--gpus", "2", "--name", "kill3", "--",
        "--strategy", "ddp", "--max-steps", "2000", "--checkpoint-every", "10000",
        "--train.log_every=1",
    )  # fmt: skip
    run = tmp_path / "runs" / "kill3"
    metrics = run / "metrics.jsonl"
    until("a training step", lambda: metrics.is_file() and metrics.stat().st_size > 0, 180)
    pid = rank_pid(run, 3)
    assert pid is not None, "no process of rank 3"
    os.kill(pid, signal.SIGKILL)

    def state() -> dict:
        return json.loads(home.hp("status", "kill3", "--json", timeout=120).stdout)

    # the end read in this process first: a `status` is a Python start (~0.5 s CPU), and at 10
    # polls a second it took a core from the tests beside
    from hpctrain import dispatch
    from hpctrain.runs.folder import RunDir

    until("the run to end", lambda: dispatch.state(RunDir(run)) not in ("PENDING", "RUNNING"), 120)
    until("the run to end FAILED", lambda: state()["state"] == "FAILED", 120)
    info = state()
    cause = info["root_cause"]
    assert (cause["rank"], cause["kind"], cause["signal"]) == (3, "signal", 9), cause
    first = home.hp("status", "kill3").stdout.splitlines()[0]
    assert "rank 3" in first and "signal 9 (SIGKILL)" in first, first
