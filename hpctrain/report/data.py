"""A run folder read into plain data (no torch, no click), safe on half-written lines."""

from __future__ import annotations

import csv
import datetime as _dt
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hpctrain.kernel import layout
from hpctrain.kernel.files import read_jsonl

# Run-folder files read here (hpctrain.kernel.layout).
METRICS, RESTARTS, EVENTS, JOBS, SAVES = (
    layout.METRICS,
    layout.RESTARTS,
    layout.EVENTS,
    layout.JOBS,
    layout.SAVES,
)
GPU_CSV, RUN_YAML, CHECKPOINTS = "gpu.csv", layout.RUN_YAML, layout.CHECKPOINTS
STEP_DIR = re.compile(r"^step-(\d{8})$")


@dataclass
class Segment:
    """One stretch of training between two (re)starts, from metrics.jsonl."""

    first_step: int
    last_step: int
    start_time: float | None
    end_time: float | None


@dataclass
class RunData:
    name: str
    path: Path
    request: dict[str, Any] = field(default_factory=dict)
    scheduler: str | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)  # every row, in file order
    starts: list[dict[str, Any]] = field(default_factory=list)  # restarts.jsonl
    events: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    saves: list[dict[str, Any]] = field(default_factory=list)  # {"step", "blocked_s", "time"}
    checkpoints: list[dict[str, Any]] = field(default_factory=list)  # {"step", "time", "path"}
    gpu: list[dict[str, Any]] = field(default_factory=list)  # gpu.csv rows
    mesh: dict[str, Any] | None = None  # mesh.json: the newest start's layout
    segments: list[Segment] = field(default_factory=list)

    @property
    def world(self) -> int:
        return int(self.request.get("nodes") or 1) * int(self.request.get("gpus") or 1)


jsonl = read_jsonl  # the kernel's tolerant JSON-lines reader


def timestamp(value: Any) -> float | None:  # Any: a JSON value of any type
    """Seconds since the epoch from a float or an ISO time ('...Z' or with an offset)."""
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        return None
    text = value.replace("Z", "+00:00")
    if re.search(r"[+-]\d{4}$", text):
        text = text[:-2] + ":" + text[-2:]
    try:
        t = _dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.UTC)
    return t.timestamp()


def segments(metrics: list[dict[str, Any]], starts: Sequence[float] = ()) -> list[Segment]:
    """Split the metric rows at each start of the job (restarts.jsonl times) and wherever the step
    goes back or repeats (a restart that resumed from an older checkpoint)."""
    bounds = sorted(starts)[1:]
    out: list[Segment] = []
    era = 0
    for row in metrics:
        step = row.get("step")
        if not isinstance(step, int):
            continue
        t = timestamp(row.get("time"))
        new_era = era
        while t is not None and new_era < len(bounds) and t >= bounds[new_era]:
            new_era += 1
        if out and step > out[-1].last_step and new_era == era:
            out[-1].last_step, out[-1].end_time = step, t
        else:
            out.append(Segment(step, step, t, t))
        era = new_era
    return out


def _checkpoints(folder: Path) -> list[dict[str, Any]]:
    found = []
    if folder.is_dir():
        for p in sorted(folder.iterdir()):
            m = STEP_DIR.match(p.name)
            if m and (p / "MANIFEST.json").is_file():
                try:
                    manifest = json.loads((p / "MANIFEST.json").read_text())
                except (OSError, ValueError):
                    manifest = {}
                found.append(
                    {
                        "step": int(m.group(1)),
                        "time": timestamp(manifest.get("time")),
                        "path": str(p),
                    }
                )
    return found


def _gpu(path: Path) -> list[dict[str, Any]]:
    """nvidia-smi samples: time, index, utilization.gpu [%], memory.used [MiB], ..."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    rows = []
    reader = csv.reader(lines, skipinitialspace=True)
    header = next(reader, None)
    if not header:
        return []
    keys = [h.split(" [")[0].strip() for h in header]
    for rec in reader:
        if len(rec) != len(keys):
            continue
        row: dict[str, Any] = {}
        for k, v in zip(keys, rec, strict=True):
            num = re.match(r"^\s*([-\d.]+)", v)
            row[k] = v.strip() if k == "time" or not num else float(num.group(1))
        row["t"] = timestamp(row.get("time"))
        rows.append(row)
    return rows


def load(path: str | Path) -> RunData:
    path = Path(path).absolute()
    try:
        frozen = yaml.safe_load((path / RUN_YAML).read_text()) or {}
    except (OSError, yaml.YAMLError):
        frozen = {}
    metrics = [r for r in jsonl(path / METRICS) if isinstance(r.get("step"), int)]
    rd = RunData(
        name=path.name,
        path=path,
        request=frozen.get("request") or {},
        scheduler=(frozen.get("profile") or {}).get("scheduler"),
        metrics=metrics,
        starts=jsonl(path / RESTARTS),
        events=jsonl(path / EVENTS),
        jobs=jsonl(path / JOBS),
        saves=jsonl(path / SAVES),
        checkpoints=_checkpoints(path / CHECKPOINTS),
        gpu=_gpu(path / GPU_CSV),
        mesh=layout.read_mesh(path),
    )
    starts = [t for t in (timestamp(s.get("time")) for s in rd.starts) if t is not None]
    rd.segments = segments(metrics, starts)
    return rd
