"""7. Scale (issue 37): the cost of each operation as the job grows to 1,000 nodes and 10,000 runs.

Every row is a count or a growth exponent (the log-log slope over >= 3 sizes), measured here with
what cannot run here stood in at the process boundary: Slurm commands that log their calls and
answer for thousands of jobs, fabricated run folders, simulated rendezvous stores and gates, and
the largest real CPU worlds this machine holds. One module per part; docs/at-scale.md has the
figures and what a site should set.

  scale_slurm    Slurm calls per runs/status/sweep/--wait/--follow at 10 / 100 / 1,000 runs
  scale_sockets  sockets per rank at 4 / 8 / 16 ranks (snapshots + async save on)
  scale_rdzv     rendezvous store bytes per keep-alive, bytes per look, longest argument
  scale_ckpt     rank 0's bytes read at resume, files per save (2 / 4 / 8 ranks), merge growth
  scale_gate     the gate's filesystem calls per node, status of a failed 1,000 x 8 run, heartbeat
  scale_runs     `runs` CPU at 1,000 / 10,000 runs, `report` memory at 10^4-10^6 lines
"""

from __future__ import annotations

import importlib
import traceback

from benchmarks import common

PARTS = ("scale_slurm", "scale_sockets", "scale_rdzv", "scale_ckpt", "scale_gate", "scale_runs")


def run(quick: bool) -> list[common.Row]:
    rows: list[common.Row] = []
    for part in PARTS:
        try:
            rows += importlib.import_module(f"benchmarks.{part}").run(quick=quick)
        except Exception as e:  # noqa: BLE001 - one broken part must not lose the others' rows
            tb = traceback.format_exc().strip().splitlines()[-6:]
            rows.append(
                common.result(part, None, "-", False, not_measured=f"crashed: {e!r}", traceback=tb)
            )
    return rows
