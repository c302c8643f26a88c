"""A run folder read into plain records (no torch, no click), safe on half-written lines; the
metric lines as columns (columns.py)."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.kernel import layout
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.files import read_jsonl
from hpctrain.report.columns import Metric, Metrics, number
from hpctrain.runs.folder import RunDir
from hpctrain.runs.phase import timestamp
from hpctrain.runs.record import Job

__all__ = ["Metric", "Metrics", "RunData", "load", "number", "segments"]

GPU_CSV = "gpu.csv"
STEP_DIR = re.compile(r"^step-(\d{8})$")


@dataclass(frozen=True)
class Save:
    """One saves.jsonl line: a checkpoint save and how long it blocked the training loop."""

    step: int | None
    blocked_s: float


@dataclass(frozen=True)
class Checkpoint:
    """A committed checkpoint folder (it has its MANIFEST.json)."""

    step: int
    time: float | None
    path: str


@dataclass(frozen=True)
class GpuSample:
    """One nvidia-smi line of gpu.csv."""

    t: float | None
    utilization: float | None  # utilization.gpu [%]


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
    nodes: int | None = None
    gpus: int | None = None  # per node
    scheduler: str | None = None
    metrics: Metrics = field(default_factory=Metrics)  # in file order, as columns
    starts: list[float | None] = field(default_factory=list)  # restarts.jsonl: each start's time
    start_lines: list[dict[str, object]] = field(default_factory=list)  # restarts.jsonl as written
    events: list[dict[str, object]] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    saves: list[Save] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    gpu: list[GpuSample] = field(default_factory=list)
    mesh: dict[str, object] | None = None  # mesh.json: the newest start's layout
    segments: list[Segment] = field(default_factory=list)

    @property
    def world(self) -> int:
        return (self.nodes or 1) * (self.gpus or 1)


def segments(metrics: Sequence[Metric], starts: Sequence[float] = ()) -> list[Segment]:
    """Split the metric rows at each start of the job (restarts.jsonl times) and wherever the step
    goes back or repeats (a restart that resumed from an older checkpoint)."""
    pairs: Iterable[tuple[int, float | None]]
    if isinstance(metrics, Metrics):  # the columns, without a Metric object per line
        times = metrics.column("time")
        pairs = zip(metrics.step, (None if t != t else t for t in times), strict=True)
    else:
        pairs = ((m.step, m.time) for m in metrics)
    bounds = sorted(starts)[1:]
    out: list[Segment] = []
    era = 0
    for step, t in pairs:
        new_era = era
        while t is not None and new_era < len(bounds) and t >= bounds[new_era]:
            new_era += 1
        if out and step > out[-1].last_step and new_era == era:
            out[-1].last_step, out[-1].end_time = step, t
        else:
            out.append(Segment(step, step, t, t))
        era = new_era
    return out


def _checkpoints(folder: Path) -> list[Checkpoint]:
    found = []
    if folder.is_dir():
        for p in sorted(folder.iterdir()):
            m = STEP_DIR.match(p.name)
            if m and (p / "MANIFEST.json").is_file():
                try:
                    manifest = json.loads((p / "MANIFEST.json").read_text())
                except (OSError, ValueError):
                    manifest = {}
                when = manifest.get("time") if isinstance(manifest, dict) else None
                found.append(Checkpoint(step=int(m.group(1)), time=timestamp(when), path=str(p)))
    return found


def _gpu(path: Path) -> list[GpuSample]:
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
        row = dict(zip(keys, rec, strict=True))
        util = re.match(r"^\s*([-\d.]+)", row.get("utilization.gpu", ""))
        rows.append(
            GpuSample(
                t=timestamp(row.get("time", "").strip()),
                utilization=float(util.group(1)) if util else None,
            )
        )
    return rows


def load(run: RunDir) -> RunData:
    path = run.path
    try:
        rec = run.record()
    except UserError:  # a broken run.yaml: the rest of the folder still tells what it did
        rec = None
    metrics = Metrics.read(path / layout.METRICS)
    rd = RunData(
        name=path.name,
        path=path,
        nodes=rec.nodes if rec else None,
        gpus=rec.gpus if rec else None,
        scheduler=rec.scheduler if rec else None,
        metrics=metrics,
        starts=[timestamp(s.get("time")) for s in run.restarts()],
        start_lines=run.restarts(),
        events=run.events(),
        jobs=run.jobs(),
        saves=[_save(s) for s in read_jsonl(path / layout.SAVES)],
        checkpoints=_checkpoints(path / layout.CHECKPOINTS),
        gpu=_gpu(path / GPU_CSV),
        mesh=layout.read_mesh(path),
    )
    rd.segments = segments(metrics, [t for t in rd.starts if t is not None])
    return rd


def _save(row: dict[str, object]) -> Save:
    step = row.get("step")
    return Save(
        step=step if isinstance(step, int) else None,
        blocked_s=float(number(row.get("blocked_s")) or 0),
    )
