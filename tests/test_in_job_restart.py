"""In-job restarts (`preemption.max_in_job_restarts`, issue 24 item 1): a dead worker is restarted
inside the job from the newest checkpoint, an error that repeats (the FATAL file) is not.

Live on the local profile (real torchrun, c10d, gloo; 2 simulated nodes x 1 CPU worker: one rank
per node is enough for a partner on the other node, and half the process starts): SIGKILL of
one rank -> COMPLETED in the same job start, bit-identical to an uninterrupted run; an exception in
the training code -> FAILED with its cause, at most one restart; `max_in_job_restarts: 0` -> today's
FAILED. The srun launcher's new-step loop, with stand-in srun/python: tests/test_in_job_script.py;
its live SIGKILL test on the loopback Slurm cluster: tests/test_in_job_slurm.py.

Measured (2 loaded cores): kill -> the first new step after it 5.5 s (torchrun's restart of both
nodes' workers: process start, import torch, rendezvous, load the checkpoint, redo 6 steps).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from _demo import STEPS, demo_run
from _preempted import preempted_run

from hpctrain.kernel import fatal, jobenv, layout

REPO = Path(__file__).resolve().parent.parent
# STEPS (60, the demo's, so its runs are the references): ~20 ms a step, the kill lands at step
# 25+, every rank held still (Job.kill_one), long before the end
TRAIN = ["--strategy", "ddp", f"--max-steps={STEPS}", "--checkpoint-every=10"]
LIVE_S = 240  # one run measured 10-25 s from submit to its end under load: 3x and more
NODES, GPUS = 2, 1


def lines(path: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except OSError:
        return []


# ---------------------------------------------------------------- what is retried


@pytest.mark.parametrize(
    "name, text, lost",
    [
        ("RuntimeError", "[gloo/transport/tcp/pair.cc:534] Connection closed by peer", True),
        ("RuntimeError", "Timed out waiting 60000ms for recv operation to complete", True),
        ("RuntimeError", "[gloo] connectFullMesh failed: Connect timeout", True),
        ("DistNetworkError", "anything", True),
        ("DistStoreError", "wait timeout after 600000ms", True),
        ("RuntimeError", "mat1 and mat2 shapes cannot be multiplied (4x8 and 16x8)", False),
        ("ValueError", "Connection reset by peer", False),  # only torch's own errors say lost
        ("KeyError", "'model.weight'", False),
    ],
)
def test_a_lost_peer_is_retried_an_error_of_the_code_is_not(name, text, lost):
    exc = type(name, (Exception,), {})(text)
    assert fatal.lost_peer(exc) is lost


def test_the_first_rank_to_write_fatal_wins(tmp_path):
    assert fatal.read(tmp_path) is None
    assert fatal.write(tmp_path, "rank 1 on n1: ValueError: boom\nsecond line")
    assert not fatal.write(tmp_path, "rank 0 on n0: echo")
    assert fatal.read(tmp_path) == "rank 1 on n1: ValueError: boom second line"


def test_restart_record_counts_steps_redone_and_time_lost(tmp_path, monkeypatch):
    from hpctrain.runtime import recovery

    monkeypatch.setenv(jobenv.JOB_ID, "77")
    monkeypatch.setenv(jobenv.RESTART_COUNT, "0")
    now = time.time()
    rows = [{"step": s, "loss": 1.0, "step_time_s": 0.5, "time": now - 4} for s in (26, 27)]
    (tmp_path / layout.METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / layout.STALLED).write_text("{}\n")
    first = recovery.record(tmp_path, resumed=20, source="train_entry")
    assert first["restart"] == 1 and first["reason"] == "stall", first
    assert (first["reached_step"], first["steps_redone"]) == (27, 7)
    assert 4 <= first["down_s"] < 30 and first["time_lost_s"] == pytest.approx(
        first["down_s"] + 3.5
    )
    assert not (tmp_path / layout.STALLED).exists()  # the batch shell must not requeue it too
    assert (tmp_path / layout.STACKS / "77-0" / "STALLED-1").is_file()
    again = recovery.record(tmp_path, resumed=27, source="train_entry")
    assert (
        again["restart"] == 2 and again["reason"] == "worker failed" and again["steps_redone"] == 0
    )


# ---------------------------------------------------------------- live, local profile


class Job:
    """A run of this test's own hpctrain home (state, config, runs/)."""

    def __init__(self, root: Path, name: str) -> None:
        from test_parallel_layouts import Home

        self.home, self.name, self.run = Home(root), name, root / "runs" / name

    def submit(self, *opts: str, train: list[str] = TRAIN, wait: bool = False) -> None:
        self.home.hp(
            "submit", "--profile", "local", "--nodes", str(NODES), "--gpus", str(GPUS),
            "--name", self.name,
            *opts, *(["--wait"] if wait else []), "--", *train,
        )  # fmt: skip

    def state(self) -> str:
        try:
            return json.loads((self.run / "state.json").read_text())["state"]
        except (OSError, ValueError, KeyError):
            return "PENDING"

    def wait(self, timeout: float = LIVE_S) -> str:
        deadline = time.monotonic() + timeout
        while self.state() in ("PENDING", "RUNNING"):
            assert time.monotonic() < deadline, (
                f"{self.name} still {self.state()} after {timeout} s"
            )
            time.sleep(0.2)
        return self.state()

    def steps(self) -> list[dict]:
        return [r for r in lines(self.run / layout.METRICS) if "loss" in r]

    @staticmethod
    def steps_of(run: Path) -> int:
        return max((r["step"] for r in lines(run / layout.METRICS) if "loss" in r), default=0)

    def ranks(self) -> dict[int, int]:
        """rank -> pid of the training processes (not torchrun or the shells)."""
        from _hold import ranks

        out = {}
        for pid in ranks(self.run):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            rank = [v[5:] for v in env if v.startswith(b"RANK=")]
            if rank:
                out[int(rank[0])] = pid
        return out

    def kill_one(self, rank: int, after_step: int) -> tuple[int, float]:
        """SIGKILL one rank past `after_step`, every rank held still (SIGSTOP) meanwhile, so the
        kill never races the end. Returns the step reached and the time of the kill."""
        deadline = time.monotonic() + LIVE_S
        while not self.steps() or self.steps()[-1]["step"] < after_step:
            assert time.monotonic() < deadline and self.state() in ("PENDING", "RUNNING")
            time.sleep(0.02)
        pids = self.ranks()
        assert len(pids) == NODES * GPUS, pids
        for pid in pids.values():
            os.kill(pid, signal.SIGSTOP)
        reached = self.steps()[-1]["step"]
        assert reached < STEPS, "the run finished before the kill"
        killed = time.time()
        os.kill(pids[rank], signal.SIGKILL)
        for r, pid in pids.items():
            if r != rank:
                os.kill(pid, signal.SIGCONT)
        return reached, killed

    def events(self, name: str) -> list[dict]:
        return [e for e in lines(self.run / layout.EVENTS) if e["event"] == name]


def reference_of(tmp_path_factory, strategy: str) -> str:
    """The final hash of the uninterrupted run of TRAIN under `strategy`: the demo's run of as many
    steps (tests/_demo.py, trained once per test session and shared by the workers, so neither
    tests/test_in_job_slurm.py on the live worker nor test_train_e2e trains it again). TRAIN's
    checkpoint cadence and the 2 nodes x 1 rank do not change it."""
    if strategy not in _references:
        run = demo_run(tmp_path_factory, strategy)
        _references[strategy] = (run / layout.FINAL_PARAMS).read_text()
    return _references[strategy]


_references: dict[str, str] = {}


def with_strategy(strategy: str) -> list[str]:
    return [*TRAIN[:1], strategy, *TRAIN[2:]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    return reference_of(tmp_path_factory, "ddp")


@pytest.mark.slow
@pytest.mark.timeout(LIVE_S * 3)
@pytest.mark.parametrize(
    ("strategy", "every"),
    [("ddp", 0), ("ddp", 4), ("fsdp", 4)],
    ids=["ddp-from-disk", "ddp-from-memory", "fsdp-from-memory"],
)
def test_a_killed_rank_restarts_in_the_job_bit_identical(
    tmp_path, tmp_path_factory, strategy, every
):
    """every 0: snapshots off, the restart loads the disk checkpoint (every 10 steps); every 4: the
    newest in-memory snapshot every rank holds (hpctrain/runtime/recovery.py; FSDP2: each rank's
    shards)."""
    reference = reference_of(tmp_path_factory, strategy)
    job = Job(tmp_path, "kill")
    job.submit(train=[*with_strategy(strategy), f"--snapshot.every_steps={every}"])
    reached, killed = job.kill_one(1, after_step=25)
    assert job.wait() == "COMPLETED", (job.run / "logs" / "batch.log").read_text()[-3000:]
    assert (job.run / layout.FINAL_PARAMS).read_text() == reference  # exact resume
    assert [s["restart_count"] for s in lines(job.run / layout.RESTARTS)] == [0]  # no requeue
    assert not job.events("requeue") and len(job.events("done")) == 1
    (ev,) = job.events("in_job_restart")
    assert ev["restart"] == 1 and ev["reason"] == "worker failed", ev
    # the newest metrics line lags the loop by one step (whose save may have committed), and the
    # ranks stopped one after another may finish one more reduction once the others go on
    assert reached <= ev["reached_step"] <= reached + 2, (reached, ev)
    top = max(reached, ev["reached_step"])
    if every:
        # the newest snapshot of every rank: the killed rank may have died inside the last one
        assert top - 2 * every <= ev["resumed_step"] <= top, (reached, ev)
        assert ev["resumed_step"] % every == 0 or ev["resumed_step"] % 10 == 0, ev
        assert ev["steps_redone"] <= 2 * every, ev
        log = (job.run / "train.log").read_text()
        # a step saved to disk takes no snapshot: under load the kill can come after the save of
        # 30 and before the next snapshot, and then the disk checkpoint is the newest state
        memory = f"resumed from the in-memory snapshot of step {ev['resumed_step']}" in log
        assert memory == bool(ev["resumed_step"] % 10), (ev, log[-2000:])
    else:
        assert ev["resumed_step"] == top // 10 * 10, (reached, ev)
    assert ev["steps_redone"] == ev["reached_step"] - ev["resumed_step"], ev
    assert ev["time_lost_s"] > 0, ev
    after = next(r["time"] for r in job.steps() if r["time"] > killed and r["step"] > reached)
    print(f"\nkill -> next new step: {after - killed:.1f} s (event: {ev})")
    info = json.loads(job.home.hp("status", "kill", "--json").stdout)
    assert info["in_job_restarts"]["count"] == 1 and info["restarts"] == 0, info
    assert info["in_job_restarts"]["steps_redone"] == ev["steps_redone"], info
    text = job.home.hp("status", "kill").stdout
    assert "in-job restarts: 1 (" in text and "restarts: 0 " in text, text
    rep = json.loads(job.home.hp("report", "kill", "--json").stdout)["runs"][0]
    assert rep["in_job_restarts"] == 1 and rep["steps_redone_in_job"] == ev["steps_redone"], rep


RAISE_MODULE = '''"""train_entry, but rank 1 raises (a bug in the training code) after step 5, at every start."""
from train_entry import watchdog
from train_entry.cli import main
from train_entry.dist import exit_now

beat = watchdog.Watchdog.beat


def broken(self, step):
    beat(self, step)
    if self.rank == 1 and step == 5:
        raise ValueError("injected by the test: a bug at step 5")


watchdog.Watchdog.beat = broken
exit_now(main())
'''


@pytest.mark.slow
@pytest.mark.timeout(LIVE_S * 3)
def test_an_exception_in_the_training_code_is_not_retried(tmp_path):
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "raise_entry.py").write_text(RAISE_MODULE)
    job = Job(tmp_path, "bug")
    started = time.monotonic()
    job.submit("--module", "raise_entry", "--set", f"environment.env.PYTHONPATH={mods}")
    assert job.wait() == "FAILED"
    took = time.monotonic() - started
    assert len(job.events("in_job_restart")) <= 1  # at most one restart wasted
    assert not job.events("requeue")
    (failed,) = job.events("failed")
    assert "ValueError: injected by the test: a bug at step 5" in failed["reason"], failed
    assert failed["reason"].startswith("rank 1 on "), failed
    info = json.loads(job.home.hp("status", "bug", "--json").stdout)
    assert "ValueError: injected by the test" in info["reason"], info
    print(f"\nan error that repeats: FAILED {took:.1f} s after submit")


STALL_MODULE = '''"""train_entry, but rank 1 hangs after step 27 of the first worker start."""
import os
import time

from train_entry import watchdog
from train_entry.cli import main
from train_entry.dist import exit_now

beat = watchdog.Watchdog.beat


def hang(self, step):
    beat(self, step)
    if self.rank == 1 and step == 27 and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        while True:  # the hang: this rank never takes another step
            time.sleep(1)


watchdog.Watchdog.beat = hang
exit_now(main())
'''


@pytest.mark.slow
@pytest.mark.timeout(LIVE_S * 3)
def test_a_stalled_rank_is_restarted_in_the_job_from_memory(tmp_path, reference):
    """The stall watchdog (watchdog.stall_s) ends every rank of a hung group with its stacks
    written; torchrun starts the group again in the job, from the snapshot of step 24 (every 4;
    the disk has 20): 3 steps redone, no requeue, bit-identical."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "stall_entry.py").write_text(STALL_MODULE)
    job = Job(tmp_path, "stall")
    job.submit(
        "--module", "stall_entry", "--set", "watchdog.stall_s=10",
        "--set", f"environment.env.PYTHONPATH={mods}",
        train=[*TRAIN, "--snapshot.every_steps=4"],
    )  # fmt: skip
    assert job.wait() == "COMPLETED", (job.run / "logs" / "batch.log").read_text()[-3000:]
    assert (job.run / layout.FINAL_PARAMS).read_text() == reference
    assert [s["restart_count"] for s in lines(job.run / layout.RESTARTS)] == [0]  # no requeue
    assert not job.events("requeue")
    (stall,) = job.events("stall")
    (ev,) = job.events("in_job_restart")
    assert ev["reason"] == "stall" and ev["resumed_step"] == 24, ev
    assert ev["steps_redone"] == 3 and stall["last_step"] == 27, (ev, stall)
    stacks = Path(stall["stacks"])
    assert "in hang" in (stacks / "rank-1.txt").read_text()  # the hung rank, caught in the act
    assert (stacks / f"{layout.STALLED}-1").is_file()  # the marker, moved by the restart
    assert not (job.run / layout.STALLED).exists()
    info = json.loads(job.home.hp("status", "stall", "--json").stdout)
    assert info["in_job_restarts"]["count"] == 1 and info["restarts"] == 0, info


@pytest.mark.slow
@pytest.mark.timeout(LIVE_S * 3)
def test_no_in_job_restart_when_the_profile_says_0(tmp_path):
    job = Job(tmp_path, "zero")
    job.submit("--set", "preemption.max_in_job_restarts=0")
    job.kill_one(1, after_step=25)
    assert job.wait() == "FAILED"
    assert not job.events("in_job_restart") and not job.events("requeue")
    assert "--max-restarts=0 " in (job.run / layout.JOB_SH).read_text()


@pytest.mark.slow
@pytest.mark.timeout(LIVE_S * 2)
def test_a_preempted_run_is_not_restarted_in_the_job(reference, tmp_path_factory):
    """Its workers leave 75 after their save. torchrun would restart them like any failed worker:
    the batch shell ends the step a second after the first rank left 75 (kernel/fatal.
    left_preempted; under load torchrun's 2 restarts cost 20 s of the grace time and a chain
    segment ended TIMEOUT), and a worker restarted meanwhile leaves at once (the STOP file) instead
    of training to the next step and saving again (seen live: a resumed run started at steps 13, 15
    and 17, one save per in-job restart). The run: tests/_preempted.py (1 node x 2 ranks, the
    profile's 2 in-job restarts; shared with test_preempt_cli)."""
    pre = preempted_run(tmp_path_factory)
    assert pre.final == "COMPLETED"  # the local profile starts the script again at once
    log = (pre.run / "train.log").read_text()
    assert log.count("checkpoint saved, exit 75") == 1, log[-3000:]
    batch = (pre.run / "logs" / "batch.log").read_text()
    assert "a rank left 75 after the stop's checkpoint: ending the step" in batch, batch[-3000:]
    assert not [e for e in lines(pre.run / layout.EVENTS) if e["event"] == "in_job_restart"]
    assert (pre.run / layout.FINAL_PARAMS).read_text() == reference
