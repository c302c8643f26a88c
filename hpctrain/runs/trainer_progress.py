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

import json
import re
import time
from pathlib import Path
from typing import Any

STATE = "trainer_state.json"
CKPT = re.compile(r"^checkpoint-(\d+)$")
BAR = re.compile(r"(\d+)/(\d+) \[([^\]\r\n]*)\]")
RATE = re.compile(r"([\d.]+)(it/s|s/it)")
LOSS = re.compile(r"""(?:'loss': '?|\bloss=)(-?[\d.]+(?:e[-+]?\d+)?)""")
TAIL = 65536  # bytes of a log read from its end


def snapshot(run: Path) -> dict[str, Any] | None:
    """`progress.snapshot`'s fields plus "source", or None when no trainer wrote anything."""
    run = Path(run)
    found = [s for s in (_from_state(run), _from_logs(run)) if s is not None]
    if not found:
        return None
    best = max(found, key=lambda s: s["step"])
    if best.get("loss") is None:  # the other source may know the loss of an earlier step
        best["loss"] = next((s["loss"] for s in found if s.get("loss") is not None), None)
    return best


# ---------------------------------------------------------------- trainer_state.json
def _from_state(run: Path) -> dict[str, Any] | None:
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
        step,
        total if isinstance(total, int) and total > 0 else None,
        losses[-1]["loss"] if losses else None,
        None,
        path.stat().st_mtime,
        str(path),
    )


def _folders(run: Path) -> list[Path]:
    """The run folder, its direct subfolders, and the folders the entry's arguments name."""
    out = [run, *(p for p in _listdir(run) if p.is_dir() and not CKPT.match(p.name))]
    frozen = _frozen(run)
    args = frozen.get("request", {}).get("args") or []
    base = Path(frozen.get("cwd") or run)
    for arg in args:
        value = str(arg).partition("=")[2] if str(arg).startswith("--") else str(arg)
        if not value or value.startswith("-") or len(value) > 4096:
            continue
        path = Path(value) if Path(value).is_absolute() else base / value
        if path.is_dir():
            out.append(path)
    return out


def _frozen(run: Path) -> dict[str, Any]:
    import yaml  # lazy: CLI start-up: a run without metrics.jsonl only

    try:
        data = yaml.load((run / "run.yaml").read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except Exception:  # noqa: BLE001 - a broken run.yaml: no arguments to look in
        return {}
    return data if isinstance(data, dict) else {}


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


def _from_logs(run: Path) -> dict[str, Any] | None:
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
        int(m.group(1)), int(m.group(2)), loss, per_step, _mtime(log), f"{log} (log lines)"
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
    step: int,
    total: int | None,
    loss: float | None,
    step_time: float | None,
    mtime: float,
    source: str,
) -> dict[str, Any]:
    eta = (total - step) * step_time if total and step_time is not None else None
    return {
        "step": step,
        "total": total,
        "loss": loss,
        "samples_per_s": None,
        "step_time_s": step_time,
        "eta_s": eta,
        "age_s": time.time() - mtime if mtime else None,
        "source": source,
    }
