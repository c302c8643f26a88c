"""The Slurm scheduler: sbatch our rendered job.sh as it is (through submitit), sacct/scontrol for
the state, scancel to cancel and to signal the batch shell.

The submission file is exactly the run's job.sh (no submitit pickles: torchrun is launched by the
script itself). The job id is parsed by submitit; state comes from submitit's watcher (sacct), with
`scontrol show job` when accounting is off.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.dispatch import mark_cancel, sacct
from hpctrain.dispatch.submitit_api import failed_job_error, sacct_text, submit_sbatch
from hpctrain.kernel import layout, states
from hpctrain.kernel.errors import UserError
from hpctrain.runs import chain
from hpctrain.runs.folder import RunDir

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile


def sbatch(
    folder: Path, script: str, extra_args: list[str] | None = None, *, what: str = "the job"
) -> str:
    """sbatch `script` (a run's job.sh, a sweep's array script); the job id, or one clear error."""
    try:
        return submit_sbatch(folder, script, extra_args)
    except (failed_job_error(), subprocess.CalledProcessError, OSError) as e:
        raise UserError(f"sbatch refused {what}: {str(e).strip()}") from None


def submit(run: RunDir) -> str:
    return sbatch(run.submitit, run.job_sh.read_text())


def submit_chain(run: RunDir, segments: list[chain.Segment]) -> list[str]:
    """Submit every segment of run.job_sh (hpctrain.runs.chain.plan): the first held, each next one
    `--dependency=afterany:<previous>`, the ids to chain.txt and jobs.jsonl, then the first
    released; returns the job ids in order. A refusal leaves no segment queued."""
    script = run.job_sh.read_text()
    ids: list[str] = []
    try:
        for s in segments:
            extra = [
                f"--time={s.time_min}",
                "--hold" if s.after is None else f"--dependency=afterany:{ids[-1]}",
            ]
            ids.append(submit_sbatch(run.submitit, script, extra))
    except Exception as e:  # submitit raises several kinds; none may leave half a chain queued
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
        raise UserError(f"sbatch refused a segment of the chain: {str(e).strip()}") from None
    run.write(layout.CHAIN, "".join(f"{i}\n" for i in ids))  # the template reads it too
    for job_id in ids:
        run.add_job(job_id, kind=chain.KIND, scheduler="slurm")
    proc = subprocess.run(
        ["scontrol", "release", ids[0]], capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60)
        raise UserError(f"scontrol release {ids[0]} failed: {proc.stderr.strip()}")
    return ids


def chain_states(run: RunDir) -> list[dict[str, str]]:
    """[{"job_id", "state"}] of every segment, in order ([] when the run is not a chain)."""
    return [{"job_id": job_id, "state": state(job_id)} for job_id in chain.ids(run)]


# States of a job that is still in the controller's queue (scontrol knows every one of them).
LIVE = states.LIVE


def state(job_id: str) -> str:
    return decide(sacct.find(sacct_text(job_id), job_id), lambda: _scontrol_state(job_id))


def decide(found: sacct.Found | None, controller: Callable[[], str | None]) -> str:
    """One job's state from what sacct found and, where that is not enough, the controller's
    (`controller()`: scontrol's JobState, None when it does not know the job)."""
    value = found.state.split()[0].upper() if found else ""  # "CANCELLED by 0" -> CANCELLED
    if found is not None and found.source == "range":
        # a range record is a guess for this element: the controller knows any element still queued,
        # and one it does not know is not pending or running whatever the range says
        live = controller()
        if live:
            return str(live).split()[0].upper()
        return states.UNKNOWN if value in LIVE else value
    if value in ("", states.UNKNOWN, states.PREEMPTED) or value in LIVE:
        # the controller knows whether a PREEMPTED job was requeued, and slurmdbd lags it: on a
        # loaded machine sacct still said PENDING seconds after the batch shell had started
        value = controller() or value or states.UNKNOWN
    return value.split()[0].upper()


def _scontrol_state(job_id: str) -> str | None:
    try:
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30
        ).stdout
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


class Slurm:
    def submit(self, run: RunDir, profile: ResolvedProfile, *, time_min: int) -> str:
        return submit(run)

    def state(self, run: RunDir) -> str:
        job_id = run.last_job_id()
        if not job_id:
            return states.UNKNOWN
        value = state(job_id)
        segments = chain.ids(run)
        if value not in LIVE and job_id in segments:
            # a chain between two segments: the one that ended its part is done, the next still
            # queued (seen under load: COMPLETED read in that window, while the chain went on).
            # The segments after the one asked about, not after the current one: the batch shell
            # may have written segment_end meanwhile, and then the current one is the next.
            for later in segments[segments.index(job_id) + 1 :]:
                if (next_state := state(later)) in LIVE:
                    return next_state
        if value == states.UNKNOWN and any(
            e.get("event") == "cancel" and e.get("job_id") == job_id for e in run.events()
        ):
            # an array task cancelled while pending leaves no record in sacct or scontrol
            return states.CANCELLED
        return value

    def cancel(self, run: RunDir) -> str:
        for job_id in chain.cancel_ids(run) or [
            run.last_job_id() or ""
        ]:  # a chain: every segment left
            if job_id:
                mark_cancel(run, job_id)
                cancel(job_id)
                run.event("cancel", job_id=job_id)
        return self.state(run)

    def signal(self, run: RunDir, name: str) -> str:
        job_id = run.last_job_id()
        proc = subprocess.run(
            ["scancel", "--batch", f"--signal={name}", str(job_id)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise UserError(
                f"scancel --batch --signal={name} {job_id} failed: {proc.stderr.strip()}"
            )
        return f"job {job_id} (scancel --batch --signal={name})"


SCHEDULER = Slurm()
