"""Progress of a script that writes no metrics.jsonl (no runtime.log_metrics, no callback), from
what its trainer writes anyway. `progress.snapshot` falls back to it; no torch, no click.

Two sources, the newer step wins:
- Hugging Face Trainer's `trainer_state.json` in its newest `checkpoint-<step>/` (global_step,
  max_steps, the last logged loss), looked for in the run folder and in every folder the entry's
  arguments name (`OUT`, `--output_dir OUT`, `--output_dir=OUT`; relative ones from the folder
  `submit` ran in);
- rank 0's output: a tqdm bar's `12/200 [...]` (Trainer's, Lightning's), the last `'loss': ...`
  (Trainer's log dicts) or `loss=...` (Lightning's bar).
The snapshot names where it came from ("source"), so `status` can say so.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.kernel.errors import UserError

if TYPE_CHECKING:
    from hpctrain.runs.folder import RunDir  # the folder imports nothing of progress

STATE = "trainer_state.json"
CKPT = re.compile(r"^checkpoint-(\d+)$")
BAR = re.compile(r"(\d+)/(\d+) \[([^\]\r\n]*)\]")
RATE = re.compile(r"([\d.]+)(it/s|s/it)")
LOSS = re.compile(r"""(?:'loss': '?|\bloss=)(-?[\d.]+(?:e[-+]?\d+)?)""")
TAIL = 65536  # bytes of a log read from its end


@dataclass(frozen=True)
class Progress:
    """Where training is (hpctrain.runs.progress.snapshot): the newest step, how fast it goes."""

    step: int
    total: int | None
    loss: float | None
    samples_per_s: float | None
    step_time_s: float | None
    eta_s: float | None
    age_s: float | None
    """Seconds since that step was written."""
    source: str | None = None
    """The file it came from when the run writes no metrics.jsonl (its trainer's)."""

    def to_json(self) -> dict[str, object]:
        out = dataclasses.asdict(self)
        if self.source is None:
            del out["source"]
        return out


def snapshot(run: RunDir) -> Progress | None:
    """The newest step a trainer wrote, with its source; None when no trainer wrote anything."""
    found = [s for s in (_from_state(run), _from_logs(run.path)) if s is not None]
    if not found:
        return None
    best = max(found, key=lambda s: s.step)
    if best.loss is None:  # the other source may know the loss of an earlier step
        loss = next((s.loss for s in found if s.loss is not None), None)
        best = dataclasses.replace(best, loss=loss)
    return best


# ---------------------------------------------------------------- trainer_state.json
def _from_state(run: RunDir) -> Progress | None:
    newest: tuple[int, Path] | None = None
    for folder in _folders(run):
        try:
            names = [p for p in folder.iterdir() if CKPT.match(p.name)]
        except OSError:
            continue
        for p in names:
            step = int(CKPT.match(p.name).group(1))  # type: ignore[union-attr]
            if (p / STATE).is_file() and (newest is None or step > newest[0]):
                newest = (step, p)
    if newest is None:
        return None
    path = newest[1] / STATE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    step, total = data.get("global_step"), data.get("max_steps")
    if not isinstance(step, int):
        return None
    losses = [h for h in data.get("log_history", []) if isinstance(h.get("loss"), (int, float))]
    return _snap(
        step=step,
        total=total if isinstance(total, int) and total > 0 else None,
        loss=losses[-1]["loss"] if losses else None,
        step_time=None,
        mtime=path.stat().st_mtime,
        source=str(path),
    )


def _folders(run: RunDir) -> list[Path]:
    """The run folder, its direct subfolders, and the folders the entry's arguments name."""
    out = [run.path, *(p for p in _listdir(run.path) if p.is_dir() and not CKPT.match(p.name))]
    try:
        record = run.record()
    except UserError:  # no run.yaml, or a broken one: no arguments to look in
        return out
    base = Path(record.cwd or run.path)
    for arg in record.args:
        value = arg.partition("=")[2] if arg.startswith("--") else arg
        if not value or value.startswith("-") or len(value) > 4096:
            continue
        path = Path(value) if Path(value).is_absolute() else base / value
        if path.is_dir():
            out.append(path)
    return out


def _listdir(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


# ---------------------------------------------------------------- log lines
def _rank0_logs(run: Path) -> list[Path]:
    logs = run / "logs"
    tee = sorted(
        (logs / "torchrun").glob("node-0/*/attempt_*/0/std*.log"), key=_mtime, reverse=True
    )
    newest = [p for p in tee if p.parent == tee[0].parent] if tee else []
    return [*newest, logs / "rank-0.log"]


def _from_logs(run: Path) -> Progress | None:
    """The newest training bar in rank 0's output, and the newest loss any of it printed."""
    bar: tuple[re.Match[str], Path] | None = None
    loss: float | None = None
    for log in _rank0_logs(run):
        text = _tail(log).replace("\r", "\n")  # tqdm redraws its line with carriage returns
        if bar is None:  # the training bar: the longest (not a save's "1/1" or an eval's)
            bars = list(BAR.finditer(text))
            most = max((int(m.group(2)) for m in bars), default=0)
            m = next((m for m in reversed(bars) if int(m.group(2)) == most > 0), None)
            bar = (m, log) if m else None
        found = LOSS.findall(text)
        if loss is None and found:
            loss = float(found[-1])
    if bar is None:
        return None
    m, log = bar
    r = RATE.search(m.group(3))
    rate = float(r.group(1)) if r else None
    per_step = rate if r is None or r.group(2) == "s/it" else (1 / rate if rate else None)
    return _snap(
        step=int(m.group(1)),
        total=int(m.group(2)),
        loss=loss,
        step_time=per_step,
        mtime=_mtime(log),
        source=f"{log} (log lines)",
    )


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - TAIL))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _snap(
    *,
    step: int,
    total: int | None,
    loss: float | None,
    step_time: float | None,
    mtime: float,
    source: str,
) -> Progress:
    eta = (total - step) * step_time if total and step_time is not None else None
    return Progress(
        step=step,
        total=total,
        loss=loss,
        samples_per_s=None,
        step_time_s=step_time,
        eta_s=eta,
        age_s=time.time() - mtime if mtime else None,
        source=source,
    )
