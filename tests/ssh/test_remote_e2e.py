"""End to end from a "laptop" (its own HOME, state and folder, no $SCRATCH) to the live two-node
Slurm cluster behind a real sshd: submit, follow the logs, preempt, resume, and the result is bit
for bit the one of an uninterrupted run. Every command goes over one SSH connection, and through one
login-node agent (hpctrain/agent/serve.py)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sshd
from _hold import held

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
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}


def accepted(site) -> int:
    return Path(site.log).read_text(errors="replace").count("Accepted publickey")


def steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            continue
    return out


def until(what: str, cond, timeout: float, poll: float = 1.0):
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(poll)
    return value


def status(laptop, name: str) -> dict:
    return json.loads(laptop.hp("status", name, "--json").stdout)


def wait(laptop, name: str, timeout: float) -> dict:
    return until(
        f"{name} ends", lambda: (s := status(laptop, name))["state"] in ENDED and s, timeout, 2
    )


@pytest.mark.slurm
@pytest.mark.timeout(480)
def test_laptop_submits_follows_preempts_and_resumes_bit_identical(slurm_cluster, laptop):
    site = laptop.site
    # requeue off: the preempted job stops, and `hpctrain resume` from the laptop brings it back
    prof = laptop.write_profile("site-e2e", extra="preemption:\n  requeue: false")
    runs = Path(site.scratch) / "runs"
    first = accepted(site)
    topo = ["--profile", str(prof), "--nodes", "2", "--gpus", "1"]
    try:
        before = set(sshd.agents(Path(site.dir)))
        out = laptop.hp("submit", *topo, "--name", "ref", "--", *TRAIN)
        assert re.search(r"submitted ref: job \d+", out.stdout), out.stdout
        agent = set(sshd.agents(Path(site.dir))) - before  # the login-node agent, started once
        laptop.hp("submit", *topo, "--name", "pre", "--", *TRAIN)
        follow = subprocess.Popen(
            [sys.executable, "-m", "hpctrain", "logs", "pre", "--follow"],
            cwd=laptop.work,
            env=laptop.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        until("pre trains past step 3", lambda: len(steps(runs / "pre")) >= 3, 240)
        with held(runs / "pre"):  # the preempt lands mid-run however slow it is under load
            out = laptop.hp("preempt", "pre")
        assert re.search(r"job \d+", out.stdout), out.stdout
        # Slurm calls the batch script's exit 75 FAILED; the run's own events say what happened
        assert wait(laptop, "pre", 120)["state"] in ("PREEMPTED", "FAILED")
        events = [
            json.loads(x)["event"] for x in (runs / "pre" / "events.jsonl").read_text().splitlines()
        ]
        assert events[:2] == ["signal", "preempted"] and "requeue" not in events, events
        followed, _ = follow.communicate(timeout=60)  # --follow ends by itself with the job
        assert re.search(r"node 0 on n1", followed) and re.search(r"node 1 on n2", followed), (
            followed[-2000:]
        )
        stopped = status(laptop, "pre")["checkpoint_step"]
        assert stopped is not None and 3 <= stopped < 30

        laptop.hp("resume", "pre")
        info = wait(laptop, "pre", 240)
        assert info["state"] == "COMPLETED", info
        assert [j["kind"] for j in info["jobs"]] == ["submit", "resume"], info["jobs"]
        assert wait(laptop, "ref", 240)["state"] == "COMPLETED"
        assert (runs / "pre" / "final_params.sha256").read_text() == (
            runs / "ref" / "final_params.sha256"
        ).read_text()
        starts = re.findall(r"step (\d+)/30\n", (runs / "pre" / "train.log").read_text())
        assert starts[0] == "0" and int(starts[1]) == stopped, starts

        # the laptop's view: logs of one rank, and the site's runs listed with their site
        assert "done: 30 steps" in laptop.hp("logs", "pre", "--rank", "1").stdout
        listed = {r["name"]: r for r in json.loads(laptop.hp("runs", "--json").stdout)}
        assert (
            listed["pre"]["state"] == "COMPLETED"
            and listed["pre"]["site"] == f"127.0.0.1:{site.port}"
            or listed["pre"]["site"].endswith(f":{site.port}")
        ), listed
        # the laptop keeps no run folder of its own, only the index entry
        assert not (laptop.work / "runs").exists()
        # one SSH connection and one login-node agent served every command above
        assert accepted(site) == first + 1
        assert len(agent) == 1 and set(sshd.agents(Path(site.dir))) - before == agent
    finally:
        for jobs in runs.glob("*/jobs.jsonl"):
            for line in jobs.read_text().splitlines():
                subprocess.run(
                    ["scancel", json.loads(line)["job_id"]], capture_output=True, timeout=30
                )
