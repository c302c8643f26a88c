"""metrics.jsonl as columns: one array per field, read line by line. A long run's file (10^6
lines) as one dict or Metric object per line held 1.6 GB (issue 37); as arrays it holds 56 bytes
a line (7 columns of 8 bytes). numpy views the arrays without a copy (the median here, the
plots); only `report` imports this module."""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

import numpy as np

from hpctrain.runs.phase import timestamp

NONE_INT = -(2**63)  # max_steps not given (an int column has no NaN)
FLOATS = ("time", "loss", "samples_per_s", "step_time_s", "mem_peak_gib")


def number(value: object) -> float | None:
    """A JSON number as it is (an int stays an int), else None."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Metric:
    """One metrics.jsonl line that has a step (a row of Metrics, made when asked for)."""

    step: int
    time: float | None
    loss: float | None
    samples_per_s: float | None
    step_time_s: float | None
    max_steps: int | None
    mem_peak_gib: list[float]
    """The peak over the ranks, as a one-item list (empty: not measured); the columns keep the
    maximum, which is what the report shows."""


def _float(value: object) -> float:
    n = number(value)
    return math.nan if n is None else float(n)


def _opt(value: float) -> float | None:
    return None if math.isnan(value) else value


class Metrics(Sequence[Metric]):
    """The lines that have a step, in file order, one array per field (NaN: not in the line)."""

    def __init__(self) -> None:
        self.step = array("q")
        self.max_steps = array("q")
        self.floats = {name: array("d") for name in FLOATS}

    @classmethod
    def read(cls, path: Path) -> Metrics:
        """Every line of `path` that is a JSON object with a whole-number step, streamed (a
        garbled or cut-short line, e.g. the last one of a killed job, is skipped)."""
        out = cls()
        try:
            f = path.open("rb")
        except OSError:
            return out
        with f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict):
                    out.add(row)
        return out

    def add(self, row: dict[str, object]) -> None:
        step, most, mem = row.get("step"), row.get("max_steps"), row.get("mem_peak_gib")
        if not isinstance(step, int) or isinstance(step, bool) or abs(step) >= 2**63:
            return
        peaks = [v for x in mem if (v := number(x)) is not None] if isinstance(mem, list) else []
        f = self.floats
        self.step.append(step)
        ok = isinstance(most, int) and not isinstance(most, bool) and abs(most) < 2**63
        self.max_steps.append(most if ok and isinstance(most, int) else NONE_INT)
        when = timestamp(row.get("time"))
        f["time"].append(math.nan if when is None else when)
        f["loss"].append(_float(row.get("loss")))
        f["samples_per_s"].append(_float(row.get("samples_per_s")))
        f["step_time_s"].append(_float(row.get("step_time_s")))
        f["mem_peak_gib"].append(max(peaks) if peaks else math.nan)

    def column(self, name: str) -> array[float]:
        """One float field (FLOATS), NaN where a line lacks it."""
        return self.floats[name]

    def middle(self, name: str) -> float | None:
        """The upper median of one float field over the lines that have it (an actual value:
        sorted(values)[n // 2]), without a Python float per line."""
        values = np.frombuffer(self.floats[name], dtype=np.float64)
        values = values[~np.isnan(values)]
        if not len(values):
            return None
        return float(np.partition(values, len(values) // 2)[len(values) // 2])

    def __len__(self) -> int:
        return len(self.step)

    def _row(self, i: int) -> Metric:
        f, most = self.floats, self.max_steps[i]
        peak = f["mem_peak_gib"][i]
        return Metric(
            step=self.step[i],
            time=_opt(f["time"][i]),
            loss=_opt(f["loss"][i]),
            samples_per_s=_opt(f["samples_per_s"][i]),
            step_time_s=_opt(f["step_time_s"][i]),
            max_steps=None if most == NONE_INT else most,
            mem_peak_gib=[] if math.isnan(peak) else [peak],
        )

    @overload
    def __getitem__(self, i: int) -> Metric: ...

    @overload
    def __getitem__(self, i: slice) -> list[Metric]: ...

    def __getitem__(self, i: int | slice) -> Metric | list[Metric]:
        if isinstance(i, slice):
            return [self._row(j) for j in range(len(self))[i]]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self._row(i % len(self))

    def __iter__(self) -> Iterator[Metric]:
        return (self._row(i) for i in range(len(self)))
