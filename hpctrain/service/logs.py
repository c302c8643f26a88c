"""Which log files to show for a run, and following them while the job runs (reading only)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain import dispatch
from hpctrain.kernel import layout
from hpctrain.kernel.errors import UserError
from hpctrain.runs.folder import TERMINAL

if TYPE_CHECKING:
    from hpctrain.runs.folder import RunDir


def log_files(run: RunDir, *, rank: int | None, node: int | None, follow: bool) -> list[Path]:
    """logs/batch.log and every node log; or one rank's (train_entry's own file, else torchrun's
    --tee files of a user script); or one node's."""
    if rank is not None and node is not None:
        raise UserError("give --rank or --node, not both")
    if rank is not None:
        files = [run.path / layout.rank_log(rank)]
        if not files[0].is_file():
            files = _torchrun_rank_logs(run, rank) or files
    elif node is not None:
        files = [run.path / layout.node_log(node)]
    else:
        files = [run.path / layout.BATCH_LOG, *sorted(run.logs.glob("node-*.log"))]
    missing = [f for f in files if not f.is_file()]
    if (rank is not None or node is not None) and missing and not follow:
        have = ", ".join(sorted(p.name for p in run.logs.glob("*.log"))) or "none yet"
        raise UserError(f"{missing[0]} does not exist (logs of {run.name}: {have})")
    return files


def _torchrun_rank_logs(run: RunDir, rank: int) -> list[Path]:
    """A user script's rank output: torchrun's --tee files, logs/torchrun/node-N/<id>/attempt_K/<local>/."""
    gpus = run.record().gpus or 1
    node, local = divmod(rank, gpus)
    found = (run.logs / "torchrun" / f"node-{node}").glob(f"*/attempt_*/{local}/std*.log")
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))


def follow(
    run: RunDir, files: list[Path], out: Callable[[str], None], *, new_nodes: bool = False
) -> None:
    """Pass what is added to `files` to `out` until the job ends; `new_nodes`: node logs that appear
    later (the job was pending when following began) are followed too. Ctrl-C stops quietly."""
    offsets = {f: 0 for f in files}
    finished_polls = 0
    try:
        while True:
            if new_nodes:
                for f in sorted(run.logs.glob("node-*.log")):
                    offsets.setdefault(f, 0)
            for f in list(offsets):
                if f.is_file():
                    with f.open("rb") as fh:
                        fh.seek(offsets[f])
                        chunk = fh.read()
                    if chunk:
                        offsets[f] += len(chunk)
                        out(chunk.decode(errors="replace"))
            if dispatch.state(run) in TERMINAL:
                finished_polls += 1
                if finished_polls > 1:  # one last read after the end
                    return
            time.sleep(1)
    except KeyboardInterrupt:
        return
