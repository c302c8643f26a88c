"""A sweep's points as they stand (moved from hpctrain/service/sweep.py): the table `status`, `runs`
and `report` show, and cancelling them. Above hpctrain.runs.folder and hpctrain.dispatch; planning
and submitting a sweep is hpctrain.service.sweep's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from hpctrain import dispatch
from hpctrain.kernel import states
from hpctrain.runs.folder import TERMINAL, RunDir
from hpctrain.runs.sweepdir import read


def final_loss(run_path: Path) -> float | None:
    try:
        lines = (run_path / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("loss"), (int, float)):
            return float(rec["loss"])
    return None


@dataclass(frozen=True)
class Point:
    """One point of a sweep as it stands (`status SWEEP --json`: these keys, in this order)."""

    index: int
    point: str  # its folder's name, <i>-<key=value,...>
    values: dict[str, object]  # the grid's value of each key
    state: str
    job_id: str | None
    checkpoint_step: int | None
    final_loss: float | None
    path: str


def table(sweep_dir: Path) -> list[Point]:
    """One row per point: index, values, state, job, newest checkpoint step, final loss."""
    rows = []
    for p in read(sweep_dir).get("points", []):
        run = RunDir(sweep_dir / str(p["folder"]))
        state = dispatch.state(run) if run.exists() and run.jobs() else states.WAITING
        rows.append(
            Point(
                index=p["index"],
                point=p["folder"],
                values=p.get("values", {}),
                state=state,
                job_id=run.last_job_id() if run.exists() else None,
                checkpoint_step=run.newest_checkpoint_step(),
                final_loss=final_loss(run.path),
                path=str(run.path),
            )
        )
    return rows


def cancel(sweep_dir: Path) -> list[tuple[str, str]]:
    """Stop the local runner (no new points) and cancel every point that is queued or running."""
    data = read(sweep_dir)
    pid = data.get("runner_pid")
    if pid:
        try:
            if "hpctrain.service.sweep_runner" in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(int(pid), 15)
        except OSError:
            pass
    out = []
    for p in data.get("points", []):
        run = RunDir(sweep_dir / str(p["folder"]))
        if not run.exists() or not run.jobs():
            continue
        before = dispatch.state(run)
        if before not in TERMINAL:
            out.append((str(p["folder"]), dispatch.cancel(run)))
    return out
