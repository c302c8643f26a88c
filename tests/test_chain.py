"""Chains past the time limit (`submit --time T --chain`): segments ended by Slurm's own time limit
that hand over through the newest checkpoint, on the live cluster with a test profile whose
max_time_min is 1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _events import flow
from _squeue import queued

HPCTRAIN = [sys.executable, "-m", "hpctrain"]
PROFILE = """name: loopchain
extends: loopback
slurm:
  max_time_min: 1
  default_time_min: 1
preemption:
  warning_s: 5              # Slurm checks time limits every 30 s: the warning comes 5-35 s early
"""
TRAIN = [
    "--train.micro_batch=4",
    "--train.global_batch=8",
    "--train.log_every=1",
    "--model.d_model=128",
    "--model.n_layers=4",
    "--model.seq_len=64",
    "--max-steps=30",
    "--checkpoint-every=10",
]


@pytest.fixture
def hp(tmp_path):
    (tmp_path / "loopchain.yaml").write_text(PROFILE)
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "OMP_NUM_THREADS": "1",
        # the tests' own data factory (slowdata.py), for the submit-time check and the jobs
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [*HPCTRAIN, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        if check:
            assert out.returncode == 0, f"{args} -> {out.returncode}\n{out.stdout}\n{out.stderr}"
        return out

    run.root = tmp_path
    return run


def test_too_long_time_names_chain_and_dry_run_lists_the_segments(hp):
    out = hp("submit", "--profile", "./loopchain.yaml", "--time", "3", "--name", "c", check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert (
        "--time 3 is more than the 1 minutes" in out.stderr
        and "add --chain to run it as 3 jobs" in out.stderr
    )

    out = hp(
        "submit",
        "--profile",
        "./loopchain.yaml",
        "--time",
        "3",
        "--chain",
        "--name",
        "c",
        "--dry-run",
    )
    assert "chain: 3 jobs (--time 3 > slurm.max_time_min 1)" in out.stdout, out.stdout
    assert re.search(
        r"segment 1: --time 1, held.*\n.*segment 2: --time 1, --dependency=afterany:<segment 1>\n"
        r".*segment 3: --time 1, --dependency=afterany:<segment 2>",
        out.stdout,
    ), out.stdout
    assert not (hp.root / "runs").exists()
    script = hp("render", "--profile", "./loopchain.yaml", "--name", "c").stdout
    assert "chain.txt" not in script  # without --chain the script has no chain block


def lines(path: Path) -> list[dict]:
    return (
        [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if path.is_file()
        else []
    )


def ended(hp, name: str, job_ids: list[str]) -> dict | None:
    """The run's `status --json` once it ended. Asked only when none of its jobs is in Slurm's
    queue any more, or 15 s after the last time: each `status` is a Python start (~0.5 s CPU)."""
    if queued(job_ids) and time.monotonic() - _asked.get(name, 0.0) < 15:
        return None
    _asked[name] = time.monotonic()
    s = json.loads(hp("status", name, "--json").stdout)
    return s if s["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") else None


_asked: dict[str, float] = {}


def until(what: str, cond, timeout: float):
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(1)
    return value


# A map-style dataset that takes a fixed time per sample (the demo task's samples, 50 ms each), so a
# step takes ~0.2 s whatever else the machine runs: how far a segment gets is set by Slurm's clock.
SLOW_DATA = """
import time

from train_entry.data import Progressions


class Slow(Progressions):
    def __getitem__(self, i):
        time.sleep(0.05)
        return super().__getitem__(i)


def build(config):
    m = config.model
    return Slow(vocab_size=m.vocab_size, seq_len=m.seq_len, num_samples=config.data.num_samples,
                seed=config.train.seed)
"""
# ~50 s of training (0.22 s a step): more than the first segment can hold (it gets the warning
# 25-55 s after its start, and starting takes ~10 s: at most ~205 steps); each later segment starts
# just after one of Slurm's 30 s checks, so it gets the warning ~27 s in (~80 steps). When the first
# segment was long the second finishes and cancels the third, else the third finishes; only on a
# slow start does the last segment need its own requeue (the profile's, as without a chain).
STEPS = 230
SLOW = [
    "--train.micro_batch=4",
    "--train.global_batch=8",
    "--train.log_every=1",
    "--model.d_model=32",
    "--model.n_layers=1",
    "--model.seq_len=16",
    "--data=slowdata:build",
    f"--max-steps={STEPS}",
    "--checkpoint-every=50",
]


@pytest.mark.slurm
@pytest.mark.timeout(540)
def test_three_segment_chain_ends_each_segment_by_the_time_limit_bit_identical(slurm_cluster, hp):
    """`--time 3 --chain` under max_time_min 1: every segment but the one that finishes training
    is ended by Slurm's own time-limit warning (--signal=B:USR2@warning_s): it saves and ends, the
    next one (afterany) resumes from that checkpoint. The final parameters are bit-identical to an
    unchained run's. A segment that starts and finds training complete (segment 1 requeued after
    the chain ended) ends at once and cancels the segments after it."""
    (hp.root / "slowdata.py").write_text(SLOW_DATA)
    topo = ["--nodes", "2", "--gpus", "1"]
    # the unchained reference, at the same world size, beside the chain (the loopback profile
    # allows --time 5 in one job)
    ref = hp("submit", "--profile", "loopback", *topo, "--time", "5", "--name", "ref", "--", *SLOW)
    ref_id = re.search(r"job (\d+)", ref.stdout).group(1)
    out = hp(
        "submit",
        "--profile",
        "./loopchain.yaml",
        *topo,
        "--time",
        "3",
        "--chain",
        "--name",
        "long",
        "--",
        *SLOW,
    )
    ids = re.search(r"job (\d+) -> (\d+) -> (\d+)", out.stdout)
    assert ids, out.stdout
    segs = list(ids.groups())
    run = hp.root / "runs" / "long"
    try:
        assert (run / "chain.txt").read_text().split() == segs
        deps = subprocess.run(
            ["scontrol", "show", "job", "-o", segs[2]], capture_output=True, text=True
        ).stdout
        assert f"Dependency=afterany:{segs[1]}" in deps and "TimeLimit=00:01:00" in deps, deps
        info = until("the chain ends", lambda: ended(hp, "long", segs), 400)
        events = lines(run / "events.jsonl")
        assert info["state"] == "COMPLETED", (info, events)
        chain = [(c["job_id"], c["state"]) for c in info["chain"]]
        done = [e["job_id"] for e in events if e["event"] == "done"]
        assert len(done) == 1 and done[0] in segs[1:], (info, events)
        k = segs.index(done[0])  # the segment that finished training
        # each segment before it got Slurm's time-limit warning (nothing here signalled it), saved
        # and ended its part without a requeue; the next one resumed from that checkpoint
        for j in segs[:k]:
            mine = [e for e in flow(events) if e.get("job_id") == j]
            assert [e["event"] for e in mine] == ["signal", "segment_end"], events
            assert mine[0]["signal"] == "USR2", events
        requeued = [e["job_id"] for e in events if e["event"] == "requeue"]
        assert requeued == [] or (k == 2 and set(requeued) == {segs[2]}), events
        saved = [e["step"] for e in events if e["event"] == "preempted"]
        starts = re.findall(rf"step (\d+)/{STEPS}\n", (run / "train.log").read_text())
        assert starts == ["0", *map(str, saved)] and len(saved) == k + len(requeued), (
            starts,
            events,
        )
        # (a warning at the very last step finds the training complete: no save, exit 0)
        assert saved == sorted(set(saved)) and all(0 < x < STEPS for x in saved), saved
        assert chain[: k + 1] == [(j, "COMPLETED") for j in segs[: k + 1]], chain
        assert chain[k + 1 :] == [(j, "CANCELLED") for j in segs[k + 1 :]], chain
        if k == 1:  # segment 2 finished training and cancelled segment 3
            assert ("chain_cancel", segs[1]) in [(e["event"], e.get("job_id")) for e in events]
        assert "chain: 3 jobs, one after another" in hp("status", "long").stdout

        ref_info = until("the reference ends", lambda: ended(hp, "ref", [ref_id]), 240)
        assert ref_info["state"] == "COMPLETED", ref_info
        assert (run / "final_params.sha256").read_text() == (
            hp.root / "runs" / "ref" / "final_params.sha256"
        ).read_text()

        # segment 1 starts again (a requeue of the finished job, its id still in chain.txt):
        # it finds training complete, ends at once and cancels the segments after it
        subprocess.run(["scontrol", "requeue", segs[0]], check=True, capture_output=True)
        until(
            "segment 1 ends again",
            lambda: (
                len([e for e in lines(run / "events.jsonl") if e["event"] == "chain_cancel"])
                > (1 if k == 1 else 0)
                and subprocess.run(
                    ["scontrol", "show", "job", "-o", segs[0]], capture_output=True, text=True
                ).stdout.count("JobState=COMPLETED")
            ),
            120,
        )
        again = [e for e in lines(run / "events.jsonl") if e["event"] == "chain_cancel"][-1]
        assert again["job_id"] == segs[0] and again["jobs"] == " ".join(segs[1:]), again
        assert "training is already complete" in (run / "logs" / "batch.log").read_text()
        assert re.findall(rf"step (\d+)/{STEPS}\n", (run / "train.log").read_text()) == starts
    finally:
        subprocess.run(["scancel", *segs, ref_id], capture_output=True, timeout=30)


def _chain_of_three(tmp_path: Path):
    """A chain's run folder: segments 9, 10, 11 submitted, 9 started."""
    from hpctrain.runs.folder import RunDir

    run = RunDir(tmp_path / "runs" / "long")
    run.path.mkdir(parents=True)
    for job in ("9", "10", "11"):
        run.add_job(job, kind="chain", scheduler="slurm")
    run.append("restarts.jsonl", {"job_id": "9", "restart_count": 0})
    return run


@pytest.mark.parametrize(
    "ended, states, expected",
    [
        # segment 1 ended its part, segment 2 still queued: the chain goes on
        (True, {"9": "COMPLETED", "10": "PENDING", "11": "PENDING"}, "PENDING"),
        # the window where the current segment reads done but the next has not been seen yet
        (False, {"9": "COMPLETED", "10": "RUNNING", "11": "PENDING"}, "RUNNING"),
        # training completed in segment 2, which cancelled segment 3: the chain is COMPLETED
        (True, {"9": "COMPLETED", "10": "COMPLETED", "11": "CANCELLED"}, "COMPLETED"),
    ],
)
def test_a_chain_is_not_finished_while_a_later_segment_is_queued(
    tmp_path, monkeypatch, ended, states, expected
):
    """Seen under load: `status` said COMPLETED between segment 1's end and segment 2's start."""
    from hpctrain.dispatch import slurm

    run = _chain_of_three(tmp_path)
    if ended:
        run.event("segment_end", job_id="9")
    if states["10"] == "COMPLETED":
        run.append("restarts.jsonl", {"job_id": "10", "restart_count": 0})
        run.event("done", job_id="10")
    monkeypatch.setattr(slurm, "state", lambda job_id: states[job_id])
    assert slurm.SCHEDULER.state(run) == expected


def test_a_chain_is_not_finished_when_its_segment_ends_while_status_reads_it(tmp_path, monkeypatch):
    """Seen in a fresh-clone run (session 13): `status` read segment 10 as the current one, the
    batch shell wrote its segment_end while sacct answered COMPLETED, and the next segment (now the
    current one) was skipped: the chain read COMPLETED with segment 11 still pending."""
    from hpctrain.dispatch import slurm

    run = _chain_of_three(tmp_path)
    run.append("restarts.jsonl", {"job_id": "10", "restart_count": 0})
    run.event("segment_end", job_id="9")
    states = {"9": "COMPLETED", "10": "COMPLETED", "11": "PENDING"}

    def state(job_id: str) -> str:
        if job_id == "10":  # the segment ends its part while sacct is asked about it
            run.event("segment_end", job_id="10")
        return states[job_id]

    monkeypatch.setattr(slurm, "state", state)
    assert slurm.SCHEDULER.state(run) == "PENDING"
