"""The report as one call: find the runs, read them, summarise, write the plots."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from hpctrain.kernel import layout
from hpctrain.kernel.errors import UserError
from hpctrain.report import data, plots, summary
from hpctrain.runs.folder import find_run


@dataclass(frozen=True)
class Report:
    runs: list[summary.Summary]
    plots: list[str]  # the PNG files written

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def build(refs: list[str], *, runs_dir: Path | None = None, with_plots: bool = True) -> Report:
    if len(refs) > 4:
        raise UserError(f"{len(refs)} runs given: overlay at most 4 (e.g. hpctrain report A B)")
    loaded = [data.load(find_run(r, runs_dir)) for r in refs]
    out = loaded[0].path / layout.REPORT
    if len(loaded) > 1:
        out = out / ("vs-" + "-".join(r.name for r in loaded[1:]))
    written = [str(p) for p in plots.write(loaded, out)] if with_plots else []
    return Report(runs=[summary.summarize(rd) for rd in loaded], plots=written)
