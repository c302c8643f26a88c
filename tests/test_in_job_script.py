"""In-job restarts in the batch script (issue 24 item 1), with stand-in srun/python: the srun
launcher starts a new step after a failed one, gives up after `preemption.max_in_job_restarts`, never
restarts an error that repeats (the FATAL file); torchrun gets `--max-restarts` from the profile.
The live runs are in tests/test_in_job_restart.py."""

from __future__ import annotations

import sys
from pathlib import Path

from test_in_job_restart import lines
from test_render import make_standins, run_script
from test_sites import script

from hpctrain.kernel import jobenv

SRUN_CALLS = """#!/bin/bash
# Stand-in srun: one line per step; runs the command once per node.
echo step >>"$RECORD/srun.calls"
while [ "${1#-}" != "$1" ]; do shift; done
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i "$@" & pids+=($!); done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc
"""
FLAKY_PYTHON = f"""#!{sys.executable}
# Stand-in worker: fails (exit 1) in its first FAIL_STEPS steps, then finishes; MODE=fatal writes
# FATAL as a rank with an error that repeats would.
import os, sys
if sys.argv[1:2] == ["-c"]:
    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])
restart = int(os.environ[{jobenv.IN_JOB_RESTART!r}])
with open(os.path.join(os.environ["RECORD"], "restarts.txt"), "a") as f:
    f.write(f"{{restart}}\\n")
if os.environ.get("MODE") == "fatal":
    with open(os.path.join(os.environ[{jobenv.RUN_DIR!r}], "FATAL"), "w") as f:
        f.write("rank 0 on n1: ValueError: boom\\n")
    sys.exit(1)
sys.exit(1 if restart < int(os.environ["FAIL_STEPS"]) else 0)
"""
SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"}


def srun_job(tmp_path, env: dict[str, str]) -> tuple[object, Path, list[str]]:
    standins = make_standins(tmp_path)
    bin_, rec = standins
    (bin_ / "srun").write_text(SRUN_CALLS)
    (bin_ / "python").write_text(FLAKY_PYTHON)
    run_dir = tmp_path / "runs" / "s"
    text = script("loopback", {"launch.launcher": "srun"}, run_dir, bin_, nodes=2, gpus=1)
    out = run_script(text, standins, env={**SLURM_ENV, **env})
    calls = (rec / "srun.calls").read_text().splitlines()
    return out, run_dir, calls


def test_launcher_srun_starts_a_new_step_after_a_failed_one(tmp_path):
    out, run_dir, calls = srun_job(tmp_path, {"FAIL_STEPS": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(calls) == 2 and "in-job restart 1 of 2, a new srun step" in out.stdout
    events = [e["event"] for e in lines(run_dir / "events.jsonl")]
    assert events == ["done"], events
    assert len(lines(run_dir / "restarts.jsonl")) == 1  # one start of the script: no requeue


def test_launcher_srun_gives_up_after_max_in_job_restarts(tmp_path):
    out, run_dir, calls = srun_job(tmp_path, {"FAIL_STEPS": "9"})
    assert out.returncode == 1 and len(calls) == 3, (calls, out.stdout)  # the first + 2 restarts
    assert [e["event"] for e in lines(run_dir / "events.jsonl")] == ["failed"]


def test_launcher_srun_never_restarts_an_error_that_repeats(tmp_path):
    out, run_dir, calls = srun_job(tmp_path, {"FAIL_STEPS": "9", "MODE": "fatal"})
    assert out.returncode == 1 and len(calls) == 1, (calls, out.stdout)
    failed = lines(run_dir / "events.jsonl")[-1]
    assert failed["event"] == "failed" and failed["reason"] == "rank 0 on n1: ValueError: boom"
    # said once, by the rank that met it (and first in status): the batch log does not repeat it
    assert "an error that repeats" in out.stderr and "boom" not in out.stderr, out.stderr


def test_torchrun_gets_max_restarts_from_the_profile(tmp_path):
    bin_, _ = make_standins(tmp_path)
    text = script("local", {}, tmp_path / "r" / "a", bin_)
    assert "--max-restarts=2 --monitor-interval=0.5 " in text
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1; fi" in text
    off = script("local", {"preemption.max_in_job_restarts": 0}, tmp_path / "r" / "b", bin_)
    assert "--max-restarts=0 " in off
