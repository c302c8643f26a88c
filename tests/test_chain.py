"""Chains past the time limit (`submit --time T --chain`): segments that hand over through the
newest checkpoint, on the live cluster with a test profile whose max_time_min is 1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

HPCTRAIN = [sys.executable, "-m", "hpctrain"]
PROFILE = """name: loopchain
extends: loopback
slurm:
  max_time_min: 1
  default_time_min: 1
preemption:
  warning_s: 5              # Slurm's ~30 s limit checks may still warn a segment early
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


def until(what: str, cond, timeout: float):
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(1)
    return value


@pytest.mark.slurm
@pytest.mark.timeout(420)
def test_three_segment_chain_hands_over_and_cancels_the_rest(slurm_cluster, hp):
    out = hp(
        "submit",
        "--profile",
        "./loopchain.yaml",
        "--nodes",
        "2",
        "--gpus",
        "1",
        "--time",
        "3",
        "--chain",
        "--name",
        "long",
        "--",
        *TRAIN,
    )
    ids = re.search(r"job (\d+) -> (\d+) -> (\d+)", out.stdout)
    assert ids, out.stdout
    first, second, third = ids.groups()
    run = hp.root / "runs" / "long"
    try:
        assert (run / "chain.txt").read_text().split() == [first, second, third]
        deps = subprocess.run(
            ["scontrol", "show", "job", "-o", third], capture_output=True, text=True
        ).stdout
        assert f"Dependency=afterany:{second}" in deps and "TimeLimit=00:01:00" in deps, deps
        until("segment 1 trains", lambda: len(lines(run / "metrics.jsonl")) >= 3, 240)
        # The time-limit warning and a preemption are the same signal to the batch shell (USR2)
        hp("preempt", "long")
        info = until(
            "the chain ends",
            lambda: (
                (s := json.loads(hp("status", "long", "--json").stdout))["state"]
                in ("COMPLETED", "FAILED", "CANCELLED")
                and s
            ),
            240,
        )
        assert info["state"] == "COMPLETED", info
        chain = [(c["job_id"], c["state"]) for c in info["chain"]]
        events = [(e["event"], e.get("job_id")) for e in lines(run / "events.jsonl")]
        done = [j for e, j in events if e == "done"]
        assert len(done) == 1 and done[0] in (second, third), events
        # segment 1 saved and handed over; the next resumed; the one that finished training
        # (segment 2, unless its own time-limit warning came first) cancelled the segments after it
        k = [first, second, third].index(done[0])
        assert chain[: k + 1] == [(j, "COMPLETED") for j in [first, second, third][: k + 1]], chain
        assert chain[k + 1 :] == [(j, "CANCELLED") for j in [first, second, third][k + 1 :]], chain
        assert all(("segment_end", j) in events for j in [first, second, third][:k]), events
        assert "requeue" not in [e for e, _ in events], events
        if k == 1:
            assert ("chain_cancel", second) in events, events
        starts = re.findall(r"step (\d+)/30\n", (run / "train.log").read_text())
        saved = next(e["step"] for e in lines(run / "events.jsonl") if e["event"] == "preempted")
        assert starts[:2] == ["0", str(saved)] and len(starts) == k + 1, starts
        assert "chain: 3 jobs, one after another" in hp("status", "long").stdout
    finally:
        subprocess.run(["scancel", first, second, third], capture_output=True, timeout=30)
