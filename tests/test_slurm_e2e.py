"""End to end on the live loopback Slurm cluster, through the real `hpctrain` CLI, exactly as a user
on a real cluster: the shipped `loopback` profile, sbatch via submitit, srun one task per node,
torchrun c10d rendezvous, gloo over lo, real checkpoints, real sacct.

    sudo make test-slurm                                  # cluster up, these tests, cluster down
    sudo .venv/bin/python -m pytest -m slurm tests/test_slurm_e2e.py -k preempt   # one of them

Sizes are tiny (the demo GPT, 2 CPU cores for 2 "nodes"). On failure every log of the test's runs is
printed (batch, node, rank logs, events, restarts) so a CI failure can be read without the machine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _events import flow, kinds
from _hold import held, ranks
from _squeue import queued

pytestmark = [pytest.mark.slurm]

HPCTRAIN = [sys.executable, "-m", "hpctrain"]
# 2 nodes x 2 "GPUs" = 4 ranks; micro batch 4 x 4 ranks = global batch 16, no accumulation.
TRAIN = ["--train.micro_batch=4", "--train.global_batch=16", "--train.log_every=1"]
# The reference config: every interrupted run must end bit-identical to it. Big enough (~0.15-0.3 s
# a step here) that a signal sent after step 3 lands long before step FULL_STEPS.
FULL_STEPS = 40
FULL = [
    *TRAIN,
    "--model.d_model=128",
    "--model.n_layers=4",
    "--model.seq_len=64",
    f"--max-steps={FULL_STEPS}",
    "--checkpoint-every=10",
]
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}


class Runs:
    """The test's working folder (runs/ under it) and the CLI, run there."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "XDG_STATE_HOME": str(root / ".state"),
            "XDG_CONFIG_HOME": str(root / ".config"),
        }

    def hp(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [*HPCTRAIN, *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check:
            assert out.returncode == 0, (
                f"hpctrain {' '.join(args)} -> {out.returncode}\n{out.stdout}\n{out.stderr}"
            )
        return out

    def submit(
        self, name: str, *opts: str, nodes: int = 2, gpus: int = 2, train: list[str] | None = None
    ) -> str:
        out = self.hp(
            "submit",
            "--profile",
            "loopback",
            "--nodes",
            str(nodes),
            "--gpus",
            str(gpus),
            "--name",
            name,
            *opts,
            "--",
            *(TRAIN if train is None else train),
        )
        m = re.search(r"job (\d+)", out.stdout)
        assert m, out.stdout
        return m.group(1)

    def status(self, name: str) -> dict:
        return json.loads(self.hp("status", name, "--json").stdout)

    def wait(self, name: str, states: set[str], timeout: float) -> dict:
        """Poll `status` until its state is one of `states`. Waiting for an end, a job of the run
        still in Slurm's queue (squeue: a C client) skips the poll: each `status` is a Python
        start of ~0.5 s CPU, taken from the tests beside this one (asked at least every 15 s)."""
        deadline = time.monotonic() + timeout
        info, asked = self.status(name), time.monotonic()
        while info["state"] not in states:
            assert time.monotonic() < deadline, (
                f"{name}: {info['state']}, not {states} in {timeout} s"
            )
            time.sleep(1)
            if states <= ENDED and time.monotonic() - asked < 15 and self.queued(name):
                continue
            info, asked = self.status(name), time.monotonic()
        return info

    def queued(self, name: str) -> bool:
        """A job of the run is in Slurm's queue (pending, running, completing)."""
        ids = [str(job["job_id"]) for job in lines(self.run(name) / "jobs.jsonl")]
        return bool(ids) and queued(ids)

    def until(self, what: str, cond, timeout: float, poll: float = 0.5):
        deadline = time.monotonic() + timeout
        while True:
            value = cond()
            if value:
                return value
            assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
            time.sleep(poll)

    def run(self, name: str) -> Path:
        return self.root / "runs" / name

    def dump(self) -> None:
        """Every log of every run of this test, for a failure report."""
        for run in sorted((self.root / "runs").glob("*")):
            files = [
                run / "jobs.jsonl",
                run / "restarts.jsonl",
                run / "events.jsonl",
                run / "train.log",
                *sorted((run / "logs").glob("*.log")),
            ]
            for f in files:
                if f.is_file():
                    text = f.read_text(errors="replace")
                    print(f"==> {f} <==\n{text[-6000:]}")


def steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if "step" in row:
            out.append(row["step"])
    return out


def lines(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def sacct_states(job_id: str) -> list[str]:
    out = subprocess.run(
        ["sacct", "-X", "-D", "-n", "-P", "-j", job_id, "-o", "State"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return [s.split()[0] for s in out.stdout.split()]


@pytest.fixture
def runs(slurm_cluster, tmp_path, request):
    r = Runs(tmp_path)
    yield r
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        r.dump()
    # Leave nothing running on the cluster for the next test.
    for jobs in (tmp_path / "runs").glob("*/jobs.jsonl"):
        for job in lines(jobs):
            subprocess.run(["scancel", str(job["job_id"])], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def reference(slurm_cluster, tmp_path_factory):
    """One uninterrupted 2 x 2 run: the result every interrupted run must reproduce bit for bit.
    Submitted with `--wait` and no batch flags (the defaults adapt to world 4 as FULL's: micro 4,
    global 16), so its test shows both too."""
    r = Runs(tmp_path_factory.mktemp("slurm-reference"))
    unbatched = [
        a for a in FULL if not a.startswith(("--train.micro_batch", "--train.global_batch"))
    ]
    assert len(unbatched) == len(FULL) - 2
    waited = r.hp(
        "submit", "--profile", "loopback", "--nodes", "2", "--gpus", "2", "--name", "ref",
        "--wait", "--", *unbatched, check=False, timeout=300,
    )  # fmt: skip
    m = re.search(r"job (\d+)", waited.stdout)
    assert m, f"{waited.stdout}\n{waited.stderr}"
    info = r.status("ref")
    if info["state"] != "COMPLETED":
        r.dump()
    return r, m.group(1), info, waited


@pytest.mark.timeout(300)
def test_submit_trains_across_two_nodes_to_completion(reference):
    r, job, info, waited = reference
    run = r.run("ref")
    assert info["state"] == "COMPLETED", (info, waited.stdout, waited.stderr)
    # no batch flags: the defaults adapt to world 4 (they failed on 16 % (4 x 8) before), and
    # --wait follows the run to its end, showing training
    assert "global batch 16 = world 4 x micro 4 x accum 1" in waited.stdout, waited.stdout
    assert f"ref: COMPLETED  step {FULL_STEPS}/{FULL_STEPS}  loss " in waited.stdout, (
        waited.stdout + waited.stderr
    )
    status = r.hp("status", "ref").stdout
    assert f"training: step {FULL_STEPS}/{FULL_STEPS}" in status and "strategy ddp" in status
    assert sacct_states(job) == ["COMPLETED"]  # the state status shows is sacct's
    assert info["job_id"] == job and info["nodes"] == 2 and info["gpus_per_node"] == 2

    # logs: both nodes (each its own hostname and 2 fake GPUs), and every one of the 4 ranks
    all_logs = r.hp("logs", "ref").stdout
    assert re.search(r"node 0 on n1 .*CUDA_VISIBLE_DEVICES=0,1", all_logs), all_logs[-3000:]
    assert re.search(r"node 1 on n2 .*CUDA_VISIBLE_DEVICES=0,1", all_logs), all_logs[-3000:]
    for rank in range(4):
        text = r.hp("logs", "ref", "--rank", str(rank)).stdout
        assert f"done: {FULL_STEPS} steps" in text, f"rank {rank}:\n{text[-2000:]}"
    assert "4 ranks" in (run / "train.log").read_text()

    # metrics for every step, checkpoints, the final hash
    assert steps(run) == list(range(1, FULL_STEPS + 1))
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step-{FULL_STEPS:08d}"
    assert (run / "checkpoints" / f"step-{FULL_STEPS:08d}" / "MANIFEST.json").is_file()
    assert re.fullmatch(r"[0-9a-f]{64}\n", (run / "final_params.sha256").read_text())
    assert kinds(lines(run / "events.jsonl")) == ["done"]


def _interrupted_run_matches_reference(r: Runs, name: str, reference, interrupts) -> dict:
    """Submit the reference config and interrupt it mid-training with each of `interrupts(job_id)`
    in turn, the next once Slurm has requeued and started the run again and it trained 3 more
    steps; every start after the first must resume from a checkpoint, and the run end
    bit-identical to the reference."""
    ref_runs, _, ref_info, _ = reference
    assert ref_info["state"] == "COMPLETED", "the reference run failed (see its test)"
    run = r.run(name)
    job = r.submit(name, train=FULL)
    logged = 0  # metrics lines before the current start's
    for n, interrupt in enumerate(interrupts, 1):
        r.until(
            f"start {n} training 3 steps", lambda m=logged: len(steps(run)) >= m + 3, 180, poll=0.2
        )
        with held(run):  # the interruption lands mid-run however slow it is under load
            assert max(steps(run)) < FULL_STEPS, "the run finished before the interruption"
            interrupt(job)
        # Restart n is recorded by the requeued batch script when Slurm starts it again (~10 s).
        r.until(
            f"the requeued job starts ({n})",
            lambda n=n: any(x["restart_count"] == n for x in lines(run / "restarts.jsonl")),
            120,
        )
        logged = len(steps(run))
    info = r.wait(name, ENDED, 240)
    assert info["state"] == "COMPLETED", info

    assert (run / "final_params.sha256").read_text() == (
        ref_runs.run("ref") / "final_params.sha256"
    ).read_text()
    n = len(interrupts)
    assert info["restarts"] >= n and info["starts"] >= n + 1, info  # status shows the restarts
    assert re.search(rf"restarts: [{n}-9]", r.hp("status", name).stdout)
    assert [h["restart_count"] for h in info["history"]][: n + 1] == list(range(n + 1))
    assert sacct_states(job).count("REQUEUED") >= n and sacct_states(job)[-1] == "COMPLETED"
    # Each later start resumed from the checkpoint its interruption saved: its first logged step
    # follows it, past the start before.
    starts = [
        int(s) for s in re.findall(rf"step (\d+)/{FULL_STEPS}\n", (run / "train.log").read_text())
    ]
    assert len(starts) >= n + 1 and starts[0] == 0, starts
    assert all(a < b for a, b in zip(starts[:n], starts[1 : n + 1], strict=True)), starts
    return info


@pytest.mark.timeout(600)
def test_preempt_then_scontrol_requeue_each_resume_bit_identical(runs, reference):
    """`hpctrain preempt` (USR2 to the batch shell: every rank saves, the script requeues), then,
    in the requeued start, `scontrol requeue` (Slurm's own): each resumes from a checkpoint, one
    run through both (one job start fewer than a run each)."""

    def preempt(job_id: str) -> None:
        out = runs.hp("preempt", "pre")
        assert f"job {job_id}" in out.stdout, out.stdout

    def requeue(job_id: str) -> None:
        out = subprocess.run(
            ["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, out.stderr

    _interrupted_run_matches_reference(runs, "pre", reference, [preempt, requeue])
    events = flow(lines(runs.run("pre") / "events.jsonl"))
    names = [e["event"] for e in events]
    # the chain: the batch shell's trap got USR2, every rank stopped and saved, the script requeued
    assert names[:3] == ["signal", "preempted", "requeue"] and names[-1] == "done", names
    assert events[0]["signal"] == "USR2"
    stopped = events[1]["step"]
    assert 3 <= stopped < FULL_STEPS
    assert re.search(rf"step {stopped}/{FULL_STEPS}\n", (runs.run("pre") / "train.log").read_text())


@pytest.mark.timeout(300)
def test_time_limit_warning_saves_and_requeues_before_the_kill(runs):
    # --time 1 with the profile's USR2@30: Slurm signals the batch shell some seconds before the
    # limit (it checks limits about every 30 s, so no exact times are asserted). The steps wait on
    # test_chain's slow data (50 ms a sample): the 30-60 s until the warning cost the tests beside
    # this one little CPU, where 4 ranks training flat out took both cores.
    from test_chain import SLOW_DATA

    (runs.root / "slowdata.py").write_text(SLOW_DATA)
    runs.env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(runs.root), os.environ.get("PYTHONPATH")])
    )
    run = runs.run("short")
    job = runs.submit(
        "short", "--time", "1", train=[*TRAIN, "--data=slowdata:build", "--max-steps=1000000"]
    )
    runs.until(
        "the requeued job starts",
        lambda: any(x["restart_count"] == 1 for x in lines(run / "restarts.jsonl")),
        180,
    )
    events = flow(lines(run / "events.jsonl"))
    names = [e["event"] for e in events]
    assert names[:3] == ["signal", "preempted", "requeue"], names
    assert events[0]["signal"] == "USR2"
    saved = events[1]["step"]
    assert (run / "checkpoints" / f"step-{saved:08d}" / "MANIFEST.json").is_file()
    states = sacct_states(job)
    assert "REQUEUED" in states and "TIMEOUT" not in states, states
    runs.hp("cancel", "short")
    assert runs.wait("short", ENDED, 60)["state"] == "CANCELLED"


@pytest.mark.timeout(420)
def test_cancel_then_resume_continues_from_newest_checkpoint(runs, reference):
    ref_runs, _, ref_info, _ = reference
    assert ref_info["state"] == "COMPLETED", "the reference run failed (see its test)"
    run = runs.run("cr")
    runs.submit("cr", train=FULL)
    runs.until("a periodic checkpoint", lambda: (run / "checkpoints" / "latest").is_file(), 180)
    runs.hp("cancel", "cr")
    assert runs.wait("cr", ENDED, 60)["state"] == "CANCELLED"
    newest = runs.status("cr")["checkpoint_step"]
    assert 10 <= newest < FULL_STEPS

    runs.hp("resume", "cr")
    info = runs.wait("cr", ENDED, 240)
    assert info["state"] == "COMPLETED", info
    assert len(info["jobs"]) == 2 and info["jobs"][1]["kind"] == "resume", info["jobs"]
    starts = re.findall(rf"step (\d+)/{FULL_STEPS}\n", (run / "train.log").read_text())
    assert len(starts) == 2 and starts[0] == "0" and int(starts[1]) == newest, starts
    assert (run / "final_params.sha256").read_text() == (
        ref_runs.run("ref") / "final_params.sha256"
    ).read_text()


@pytest.mark.timeout(240)
def test_wrong_interface_name_fails_fast_naming_it(runs):
    bad = runs.root / "badnet.yaml"
    bad.write_text(
        "name: badnet\nextends: loopback\nnetwork:\n  socket_ifname: nosuch0\n"
        "  gloo_socket_ifname: nosuch0\n"
    )
    job = runs.hp(
        "submit",
        "--profile",
        str(bad),
        "--nodes",
        "2",
        "--gpus",
        "1",
        "--name",
        "bad",
        "--",
        *TRAIN[1:],
        "--train.micro_batch=8",
        "--max-steps=5",
    )
    assert "job" in job.stdout
    # The profile's time limit is 10 minutes: a hang would end in TIMEOUT, far past this wait.
    info = runs.wait("bad", ENDED, 150)
    assert info["state"] == "FAILED", info
    text = runs.hp("logs", "bad").stdout + "".join(
        p.read_text(errors="replace") for p in (runs.run("bad") / "logs").glob("rank-*.log")
    )
    assert "nosuch0" in text, text[-4000:]
    assert not (runs.run("bad") / "final_params.sha256").exists()


@pytest.mark.timeout(300)
def test_fsdp_and_deepspeed_jobs_at_once_across_two_nodes_on_different_ports(runs):
    # Issue items 6 and 7 in one pair of runs (the live suite must stay short): an FSDP job and a
    # DeepSpeed job, 2 nodes x 1 GPU each, side by side on the same nodes (2 gres GPUs each).
    train = [
        "--train.micro_batch=8",
        "--train.global_batch=16",
        "--max-steps=8",
        "--checkpoint-every=4",
    ]
    jobs = {"fsdp": runs.submit("fsdp", "--strategy", "fsdp", gpus=1, train=train)}
    # the first job's ranks wait (SIGSTOP) until the second's exist: under load its 8 steps once
    # ended before the second job started
    runs.until("fsdp's ranks", lambda: ranks(runs.run("fsdp")), 240, poll=0.05)
    with held(runs.run("fsdp")):
        jobs["deepspeed"] = runs.submit("deepspeed", "--strategy", "deepspeed", gpus=1, train=train)
        runs.until("deepspeed's ranks", lambda: ranks(runs.run("deepspeed")), 240, poll=0.2)
    endpoints = {}
    for strategy in jobs:
        info = runs.wait(strategy, ENDED, 240)
        assert info["state"] == "COMPLETED", info
        run = runs.run(strategy)
        assert f"{strategy}: 2 ranks" in (run / "train.log").read_text()
        nodes = runs.hp("logs", strategy).stdout
        assert re.search(r"node 0 on n1 ", nodes), nodes[-2000:]
        assert re.search(r"node 1 on n2 ", nodes), nodes[-2000:]
        assert (run / "checkpoints" / "latest").read_text().strip() == "step-00000008"
        assert (run / "final_params.sha256").is_file()
        found = set(re.findall(r"endpoint=(\S+)", nodes))
        assert len(found) == 1, found  # both nodes of a job agree on one endpoint
        endpoints[strategy] = found.pop()
    # two jobs at once: different rendezvous ports, never torchrun's default 29500 ...
    assert endpoints["fsdp"] != endpoints["deepspeed"], endpoints
    assert not any(e.endswith(":29500") for e in endpoints.values()), endpoints
    # ... and they really ran at the same time: each started before the other ended (sacct)
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", ",".join(jobs.values()), "-o", "JobID,Start,End"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    times = {row.split("|")[0]: row.split("|")[1:] for row in out.split()}
    (sa, ea), (sb, eb) = times[jobs["fsdp"]], times[jobs["deepspeed"]]
    assert sa < eb and sb < ea, times
