"""A SIGTERM-with-grace preemption on the live test cluster (issue 34; NCSA Delta's preempt
partitions, Slurm's PreemptMode=REQUEUE with a GraceTime): `preemption.signal: TERM`, the run saves
on the TERM and comes back by itself.

The signals are Slurm's own for such a preemption: at its start slurmctld sends SIGCONT and SIGTERM
to the job's tasks only, not to the batch shell (job_signal without KILL_FULL_JOB), which is what
`scancel --signal=TERM JOB` sends; the requeue at the grace time's end is then not needed, the run
has requeued itself (the batch shell's own, tests/test_site_keys.py covers the one Slurm makes).

    sudo .venv/bin/python -m pytest -m slurm tests/test_term_preempt_live.py
"""

from __future__ import annotations

import re
import subprocess

import pytest
from _events import flow
from _hold import held
from test_slurm_e2e import ENDED, TRAIN, Runs, lines, sacct_states, steps
from test_slurm_e2e import runs as runs  # the fixture: one Runs per test, nothing left queued

pytestmark = [pytest.mark.slurm]

STEPS = 150  # ~40 ms a step here: room for two interruptions
SMALL = [*TRAIN, "--model.d_model=64", "--model.n_layers=2", "--model.seq_len=32"]


def interrupt(runs: Runs, run, after: int, command: list[str]) -> None:
    """Once the current start trained 3 steps past `after`, run `command` with the ranks held
    (it lands mid-run however loaded the machine is)."""
    runs.until("3 steps trained", lambda: len(steps(run)) >= after + 3, 180, poll=0.2)
    with held(run):
        assert max(steps(run)) < STEPS, "the run finished before the interruption"
        out = subprocess.run(command, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr


def started(runs: Runs, run, n: int) -> None:
    runs.until(
        f"start {n}",
        lambda: any(x["restart_count"] == n for x in lines(run / "restarts.jsonl")),
        120,
    )


@pytest.mark.timeout(300)
def test_a_term_preemption_saves_and_the_run_comes_back_by_itself(runs):
    run = runs.run("term")
    train = [*SMALL, f"--max-steps={STEPS}", "--checkpoint-every=1000"]
    job = runs.submit("term", "--set", "preemption.signal=TERM", nodes=1, gpus=2, train=train)
    # 1. the start of a GraceTime: SIGTERM to the job's tasks, not to the batch shell
    interrupt(runs, run, 0, ["scancel", "--signal=TERM", job])
    started(runs, run, 1)
    # 2. its end, were the job still there: Slurm requeues it itself (TERM, then KILL, to all)
    interrupt(runs, run, len(steps(run)), ["scontrol", "requeue", job])
    started(runs, run, 2)
    info = runs.wait("term", ENDED, 180)
    assert info["state"] == "COMPLETED", info

    events = flow(lines(run / "events.jsonl"))
    names = [e["event"] for e in events]
    # The tasks' TERM: every rank saved (off the checkpoint cadence) and the batch shell requeued;
    # it saw no signal itself and records the TERM once the step has ended, after `preempted`.
    assert names[:3] == ["preempted", "signal", "requeue"] and names[-1] == "done", names
    assert events[1]["signal"] == "TERM" and events[1]["to"] == "tasks", events[1]
    # Slurm's own requeue: TERM to the batch shell too, and the batch shell left the requeue to
    # Slurm (here the ranks saved again within KillWait and it said so; never a failed second one)
    assert names[3] == "signal" and "failed" not in names, names
    assert events[3]["signal"] == "TERM" and "to" not in events[3], events[3]
    log = (run / "logs" / "batch.log").read_text()
    assert "scontrol requeue" not in log, log[-3000:]  # hpctrain_fail's "scontrol requeue N failed"
    if names[4:6] == ["preempted", "requeue"]:  # it got that far before Slurm's KILL
        assert re.search(r"\(JobState=[A-Z_]+\): no requeue from the batch shell", log), log
    saved = events[0]["step"]
    assert 3 <= saved < STEPS, saved
    starts = [int(s) for s in re.findall(rf"step (\d+)/{STEPS}\n", (run / "train.log").read_text())]
    assert starts[:2] == [0, saved], starts  # the second start resumed from that checkpoint
    states = sacct_states(job)
    assert states.count("REQUEUED") == 2 and states[-1] == "COMPLETED", states
    assert "CANCELLED" not in states and "FAILED" not in states, states
