"""What `submit --wait` and `status` say about a run: progress from metrics.jsonl, and on failure
the first root-cause line, not torchrun's wrapper traceback (logs as torchrun and train_entry write
them)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hpctrain.runs.progress import Follower, describe, root_cause, snapshot

WRAPPER = """Traceback (most recent call last):
  File "/usr/lib/python3.11/runpy.py", line 198, in _run_module_as_main
  File ".../torch/distributed/run.py", line 1019, in run
    elastic_launch(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_09:05:00
  host      : n1
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 6920)
"""


def _run(tmp_path: Path, node0: str, node1: str = "") -> Path:
    (tmp_path / "logs").mkdir(parents=True)
    (tmp_path / "logs" / "node-0.log").write_text(node0)
    (tmp_path / "logs" / "node-1.log").write_text(node1)
    return tmp_path


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
    assert snap["step"] == 10 and snap["total"] == 60 and snap["eta_s"] == 25.0
    assert describe(snap) == "step 10/60  loss 2  320 samples/s  ETA 0:00:25"


def test_root_cause_is_train_entrys_error_line(tmp_path):
    run = _run(
        tmp_path, "[default0]:error: train.global_batch(16) is not divisible by ...\n" + WRAPPER
    )
    cause = root_cause(run)
    assert cause == {
        "line": "error: train.global_batch(16) is not divisible by ...",
        "log": str(run / "logs" / "node-0.log"),
    }


def test_root_cause_is_rank_0s_exception_not_the_wrapper(tmp_path):
    rank1 = (
        '[rank1]: Traceback (most recent call last):\n[rank1]:   File "x.py", line 3\n'
        "[rank1]: RuntimeError: Connection closed by peer\n"
    )
    rank0 = (
        '[rank0]: Traceback (most recent call last):\n[rank0]:   File "train.py", line 9\n'
        "[rank0]:     build()\n[rank0]: ValueError: d_model must be even\n"
    )
    run = _run(tmp_path, "hpctrain: node 0 on n1\n" + rank0 + WRAPPER, rank1 + WRAPPER)
    assert root_cause(run)["line"] == "ValueError: d_model must be even"


def test_root_cause_without_an_exception_names_the_exit(tmp_path):
    run = _run(tmp_path, "hpctrain: node 0 on n1\n" + WRAPPER)
    cause = root_cause(run)
    assert cause["line"].startswith("rank 0 on n1 exited with code 1"), cause


def test_root_cause_of_a_setup_failure_is_the_scripts_reason(tmp_path):
    run = _run(tmp_path, "")
    (run / "events.jsonl").write_text(
        json.dumps(
            {"event": "failed", "reason": "cannot activate the profile's virtual environment"}
        )
        + "\n"
    )
    assert root_cause(run)["line"] == "cannot activate the profile's virtual environment"


def test_follower_without_a_terminal_prints_a_line_a_minute_and_at_each_change(tmp_path):
    lines: list[str] = []
    f = Follower(tmp_path, total=60, live=False, out=lines.append, every_s=60)
    for state in ("PENDING", "RUNNING", "RUNNING", "RUNNING", "COMPLETED"):
        f(state)
    assert [x.split()[1] for x in lines] == ["PENDING", "RUNNING", "COMPLETED"]
    f.last_print -= 61  # a minute later, still running: one more line
    f("COMPLETED")
    assert len(lines) == 4
