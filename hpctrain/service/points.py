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
from hpctrain.runs.progress import lines_from_end
from hpctrain.runs.sweepdir import read


def final_loss(run_path: Path) -> float | None:
    """The loss of the newest metrics line that has one, read from the file's end (a sweep of
    long runs reads a block of each, not every point's whole file)."""
    try:
        for line in lines_from_end(run_path / "metrics.jsonl"):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            loss = rec.get("loss") if isinstance(rec, dict) else None
            if isinstance(loss, int | float) and not isinstance(loss, bool):
                return float(loss)
    except OSError:
        return None
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
    listed = [(p, RunDir(sweep_dir / str(p["folder"]))) for p in read(sweep_dir).get("points", [])]
    known = dispatch.states([run for _, run in listed if run.exists() and run.jobs()])
    for p, run in listed:
        waiting = not (run.exists() and run.jobs())
        state = known.get(run) or (states.WAITING if waiting else dispatch.state(run))
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
    runs = {str(p["folder"]): RunDir(sweep_dir / str(p["folder"])) for p in data.get("points", [])}
    queued = {name: run for name, run in runs.items() if run.exists() and run.jobs()}
    before = dispatch.states(list(queued.values()))  # one question, one scancel for them all
    live = {name: run for name, run in queued.items() if before.get(run) not in TERMINAL}
    after = dispatch.cancel_many(list(live.values()))
    return [(name, after.get(run, states.UNKNOWN)) for name, run in live.items()]
