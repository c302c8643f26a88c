"""The sweep folder: sweep.json, finding a sweep by name or path, and its points' folders.

Below hpctrain.runs.folder (which resolves NAME/<i> through point_dir) and hpctrain.jobs.sweep (which plans,
submits and shows sweeps): it reads and writes sweep.json and the run index, nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpctrain.runs import index as runindex
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.files import utc_now
from hpctrain.kernel.rundir import RunFolder

SWEEP_FILE = "sweep.json"
ARRAY_FILE = "array.sh"
KIND = "sweep"  # jobs.jsonl kind of a point's array task; the run index's kind of a sweep


def is_sweep(path: Path) -> bool:
    return (path / SWEEP_FILE).is_file()


def read(sweep_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((sweep_dir / SWEEP_FILE).read_text())
    except (OSError, ValueError) as e:
        raise UserError(
            f"{sweep_dir / SWEEP_FILE} cannot be read ({e}); the sweep's points are "
            "still run folders of their own"
        ) from None
    return data if isinstance(data, dict) else {}


def write(sweep_dir: Path, data: dict[str, Any]) -> None:
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
        if item.get("kind") == KIND and item.get("name") == ref and is_sweep(Path(item["path"])):
            return Path(item["path"])
    return None


def point_dir(sweep_dir: Path, which: str) -> Path | None:
    """A point by its index (`3`) or its folder name (`3-lr=0.1`)."""
    for p in read(sweep_dir).get("points", []):
        if which in (str(p.get("index")), p.get("folder")):
            return sweep_dir / str(p["folder"])
    return None


def record(name: str, sweep_dir: Path) -> None:
    """The sweep in the run index (`status NAME` finds it from any directory)."""
    runindex.record({"name": name, "path": str(sweep_dir), "kind": KIND, "time": utc_now()})


def all_sweeps(runs_dir: Path | None = None) -> list[Path]:
    seen: dict[Path, None] = {}
    base = runs_dir or Path("runs")
    if base.is_dir():
        for child in sorted(base.iterdir()):
            if is_sweep(child):
                seen.setdefault(child.resolve())
    for item in runindex.entries():
        if item.get("kind") == KIND and is_sweep(Path(item.get("path", ""))):
            seen.setdefault(Path(item["path"]))
    return list(seen)
