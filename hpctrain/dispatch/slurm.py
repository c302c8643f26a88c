"""The Slurm scheduler: submitit's SlurmExecutor submits our rendered job.sh as it is.

The submission file is exactly the run's job.sh (no submitit pickles: torchrun is launched by the
script itself). The job id is parsed by submitit; state comes from submitit's watcher (sacct), with
`scontrol show job` when accounting is off.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from submitit.core.utils import FailedJobError
from submitit.slurm.slurm import SlurmExecutor, SlurmJob

from hpctrain.kernel.errors import UserError
from hpctrain.runs import RunDir

logging.getLogger("submitit").setLevel(logging.ERROR)  # we report sacct trouble ourselves


class ScriptSlurmExecutor(SlurmExecutor):
    """A SlurmExecutor whose sbatch file is our rendered script, byte for byte."""

    def __init__(self, folder: Path, script: str) -> None:
        super().__init__(folder)
        self._script = script

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        return self._script


def submit(run: RunDir) -> str:
    run.submitit.mkdir(parents=True, exist_ok=True)  # submitit writes its submission file there
    ex = ScriptSlurmExecutor(run.submitit, run.job_sh.read_text())
    try:
        job = ex._submit_command("")
    except (FailedJobError, subprocess.CalledProcessError, OSError) as e:
        raise UserError(f"sbatch refused the job: {str(e).strip()}") from None
    return str(job.job_id)


def state(job_id: str) -> str:
    value = _sacct_state(job_id)
    if value in ("", "UNKNOWN", "PREEMPTED"):  # PREEMPTED: the controller knows if it was requeued
        value = _scontrol_state(job_id) or value or "UNKNOWN"
    return value.split()[0].upper()  # "CANCELLED by 0" -> CANCELLED


def _sacct_state(job_id: str) -> str:
    """sacct through submitit's own command and parser, but with its stderr captured: a cluster
    that is down or has accounting off must not spray sacct errors over `hpctrain runs`."""
    watcher = SlurmJob.watcher
    watcher.register_job(job_id)
    command = watcher._make_command()
    if not command:
        return ""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if proc.returncode != 0:
        return ""
    return watcher.read_info(proc.stdout).get(job_id, {}).get("State", "")


def _scontrol_state(job_id: str) -> str | None:
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for field in out.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return None


def cancel(job_id: str) -> None:
    proc = subprocess.run(["scancel", job_id], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"scancel {job_id} failed: {proc.stderr.strip()}")
