"""The report as one call: find the runs, read them, summarise, write the plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.kernel import layout
from hpctrain.kernel.errors import UserError
from hpctrain.report import data, plots, summary
from hpctrain.runs.folder import find_run


def build(
    refs: list[str], *, runs_dir: Path | None = None, with_plots: bool = True
) -> dict[str, Any]:

    if len(refs) > 4:
        raise UserError(f"{len(refs)} runs given: overlay at most 4 (e.g. hpctrain report A B)")
    found = [find_run(r, runs_dir) for r in refs]
    loaded = [data.load(r.path) for r in found]
    out = loaded[0].path / layout.REPORT
    if len(loaded) > 1:
        out = out / ("vs-" + "-".join(r.name for r in loaded[1:]))
    written = [str(p) for p in plots.write(loaded, out)] if with_plots else []
    return {"runs": [summary.summarize(rd) for rd in loaded], "plots": written}
