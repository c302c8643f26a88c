"""The sweep folder: sweep.json, finding a sweep by name or path, and its points' folders.

Below hpctrain.runs.folder (which resolves NAME/<i> through point_dir) and hpctrain.service.sweep (which plans,
submits and shows sweeps): it reads and writes sweep.json and the run index, nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from hpctrain.kernel.errors import UserError
from hpctrain.kernel.rundir import RunFolder
from hpctrain.runs import index as runindex

SWEEP_FILE = "sweep.json"
ARRAY_FILE = "array.sh"
KIND = "sweep"  # jobs.jsonl kind of a point's array task; the run index's kind of a sweep


def is_sweep(path: Path) -> bool:
    return (path / SWEEP_FILE).is_file()


class PointEntry(TypedDict, total=False):
    index: int
    folder: str  # <i>-<key=value,...>
    values: dict[str, object]  # the grid's value of each key


class SweepFile(TypedDict, total=False):
    """sweep.json, as hpctrain/service/sweep.py writes it (and resume adds to it)."""

    name: str
    scheduler: str
    grid: list[list[object]]  # [key, [values]] per axis
    max_parallel: int | None
    points: list[PointEntry]
    array_job: str  # Slurm: the job array's id (a resume's: its new array)
    runner_pid: int | None  # local: the runner that starts the points one after another
    resumes: list[dict[str, object]]


def read(sweep_dir: Path) -> SweepFile:
    try:
        data: SweepFile = json.loads((sweep_dir / SWEEP_FILE).read_text())
    except (OSError, ValueError) as e:
        raise UserError(
            f"{sweep_dir / SWEEP_FILE} cannot be read ({e}); the sweep's points are "
            "still run folders of their own"
        ) from None
    return data if isinstance(data, dict) else SweepFile()


def write(sweep_dir: Path, data: Mapping[str, object]) -> None:
    RunFolder(sweep_dir).write(SWEEP_FILE, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_array(sweep_dir: Path, script: str) -> None:
    """The array script, as sbatch gets it (a resume's replaces the one before)."""
    RunFolder(sweep_dir).write(ARRAY_FILE, script)


def find(ref: str, runs_dir: Path | None = None) -> Path | None:
    """The sweep folder for a sweep name or path, if REF is one."""
    runindex.check_ref(ref)
    candidates = [Path(ref)]
    if "/" not in ref:
        candidates.append((runs_dir or Path("runs")) / ref)
    for c in candidates:
        if is_sweep(c):
            return c.resolve()
    for item in reversed(runindex.entries()):
        if item.kind == KIND and item.name == ref and is_sweep(item.path):
            return item.path
    return None


def point_dir(sweep_dir: Path, which: str) -> Path | None:
    """A point by its index (`3`) or its folder name (`3-lr=0.1`)."""
    for p in read(sweep_dir).get("points", []):
        if which in (str(p.get("index")), p.get("folder")):
            return sweep_dir / str(p["folder"])
    return None


def record(name: str, sweep_dir: Path) -> None:
    """The sweep in the run index (`status NAME` finds it from any directory)."""
    runindex.record(name, sweep_dir, KIND)


def all_sweeps(runs_dir: Path | None = None) -> list[Path]:
    seen: dict[Path, None] = {}
    base = runs_dir or Path("runs")
    if base.is_dir():
        for child in sorted(base.iterdir()):
            if is_sweep(child):
                seen.setdefault(child.resolve())
    for item in runindex.entries():
        if item.kind == KIND and is_sweep(item.path):
            seen.setdefault(item.path)
    return list(seen)
