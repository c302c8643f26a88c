"""Is a job still in Slurm's queue: squeue (a C client) instead of a `status` (a Python start of
~0.5 s CPU taken from the tests beside the one that waits)."""

from __future__ import annotations

import subprocess


def queued(job_ids: list[str]) -> bool:
    """Any of these jobs (or an array's tasks) in Slurm's queue; False when squeue cannot say
    (a job the controller has forgotten): the caller asks `status` then."""
    out = subprocess.run(
        ["squeue", "-h", "-j", ",".join(job_ids), "-o", "%T"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.returncode == 0 and bool(out.stdout.strip())
