"""A run that finished is finished: an entry that leaves with exit 0 after a stop request (it trained
to its end, or never looked at the flag) ends COMPLETED with one start and is never requeued; only a
save-and-exit-75 (or a failure) after the stop requeues. Live, for each entry kind: train_entry
(the stop lands at its last step), `--script` and `--module` (a script that ignores the stop).

    sudo .venv/bin/python -m pytest -m slurm tests/test_finished_runs.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_slurm_e2e import ENDED, TRAIN, Runs, lines
from test_slurm_e2e import runs as runs  # the fixture: one Runs per test, nothing left queued

pytestmark = [pytest.mark.slurm]

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "tests" / "scripts"


def _started(runs: Runs, name: str) -> bool:
    """The batch shell is in its start loop (its traps are set): a preempt now reaches them."""
    return bool(lines(runs.run(name) / "restarts.jsonl"))


@pytest.mark.timeout(420)
def test_exit_0_after_a_stop_request_is_completed_for_every_entry(runs):
    out = runs.root / "out"
    # train_entry: one step, so the stop it sees lands at its last step (found complete: exit 0)
    runs.submit("entry", gpus=1, train=[*TRAIN, "--max-steps=1", "--model.n_layers=1"])
    runs.submit(
        "module",
        "--module",
        "ignores_stop",
        "--set",
        f"environment.env.PYTHONPATH={SCRIPTS}",
        gpus=1,
        train=[str(out / "module"), "12", "0.5"],
    )
    script = [str(out / "script"), "12", "0.5"]
    runs.submit("script", "--script", str(SCRIPTS / "ignores_stop.py"), train=script)
    ready = {
        "entry": lambda: _started(runs, "entry"),
        "module": lambda: (out / "module" / "started").is_file(),
        "script": lambda: (out / "script" / "started").is_file(),
    }
    # the two 2 x 1 jobs run at once on 2 nodes x 2 GPUs, the 2 x 2 one queues behind them
    # (submitted between them, it held the second back: 3 starts one after another)
    for name, cond in ready.items():
        runs.until(f"{name} started", cond, 240)
        runs.hp("preempt", name)
    for name in ready:
        info = runs.wait(name, ENDED, 180)
        run = runs.run(name)
        events = [e["event"] for e in lines(run / "events.jsonl")]
        assert info["state"] == "COMPLETED", (name, info, events)
        assert len(lines(run / "restarts.jsonl")) == 1, (name, "started again")
        assert "signal" in events and events[-1] == "done", (name, events)
        assert "requeue" not in events and "preempted" not in events, (name, events)
        log = (run / "logs" / "batch.log").read_text()
        assert "exited 0 after the stop request: the run is complete" in log, (name, log[-2000:])
    for name, world in (("script", 4), ("module", 2)):  # trained to the end on every rank
        assert sorted(p.name for p in (out / name).glob("done-*")) == [
            f"done-{r}" for r in range(world)
        ]
