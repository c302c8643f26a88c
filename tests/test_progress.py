"""What `submit --wait` and `status` say about a run's progress, from metrics.jsonl (why it failed:
tests/test_cause.py)."""

from __future__ import annotations

import json
import time

from hpctrain.runs.progress import Follower, describe, snapshot


def test_progress_from_the_newest_metrics_lines(tmp_path):
    assert snapshot(tmp_path) is None and describe(None) == "no training step yet"
    now = time.time()
    rows = [
        {
            "step": s,
            "loss": 3.0 - s / 10,
            "samples_per_s": 320.0,
            "step_time_s": 0.5,
            "max_steps": 60,
            "time": now,
        }
        for s in range(1, 11)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"ste')
    snap = snapshot(tmp_path)
    assert snap.step == 10 and snap.total == 60 and snap.eta_s == 25.0
    assert (
        describe(snap) == "step 10/60  loss 2  320 samples/s (median, last 10 steps)  ETA 0:00:25"
    )


def test_follower_without_a_terminal_prints_a_line_a_minute_and_at_each_change(tmp_path):
    lines: list[str] = []
    f = Follower(tmp_path, total=60, live=False, out=lines.append, every_s=60)
    for state in ("PENDING", "RUNNING", "RUNNING", "RUNNING", "COMPLETED"):
        f(state)
    assert [x.split()[1] for x in lines] == ["PENDING", "RUNNING", "COMPLETED"]
    f.last_print -= 61  # a minute later, still running: one more line
    f("COMPLETED")
    assert len(lines) == 4
