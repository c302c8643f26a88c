"""The Slurm scheduler: sbatch our rendered job.sh as it is (through submitit), sacct/scontrol for
the state, scancel to cancel and to signal the batch shell.

The submission file is exactly the run's job.sh (no submitit pickles: torchrun is launched by the
script itself). The job id is parsed by submitit; states come from one `sacct -j ID,ID,...` for
all the jobs asked (Query), then one `scontrol show job` for those sacct cannot settle: a listing of
1,000 runs asks Slurm twice, not 2,000 times (issue 37).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.dispatch import mark_cancel, sacct
from hpctrain.dispatch.submitit_api import failed_job_error, submit_sbatch
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
    ids = chain.ids(run)
    ask = Query(ids) if ids else None
    return [{"job_id": job_id, "state": ask.state(job_id)} for job_id in ids if ask]


# States of a job that is still in the controller's queue (scontrol knows every one of them).
LIVE = states.LIVE


def state(job_id: str) -> str:
    return Query([job_id]).state(job_id)


class Query:
    """The states of many jobs from one look at Slurm: sacct for all of them (sacct.CHUNK ids a
    call), then the controller once for every id that sacct could not settle (decide()). An id
    not asked here is asked alone."""

    def __init__(self, job_ids: Iterable[str]) -> None:
        self.asked = set(job_ids)
        self.found = sacct.index(_sacct(self.asked), self.asked)
        unsettled = []
        for job_id in sorted(self.asked):
            called: list[bool] = []
            decide(self.found.get(job_id), lambda c=called: c.append(True))  # type: ignore[misc]
            if called:
                unsettled.append(job_id)
        self.control = _controller(unsettled)

    def state(self, job_id: str) -> str:
        if job_id not in self.asked:
            return state(job_id)
        return decide(self.found.get(job_id), lambda: self.control.get(job_id))


def _sacct(job_ids: Iterable[str]) -> str:
    """The listings of every sacct call for `job_ids`, one header kept; "" when sacct cannot say
    (a cluster that is down or has accounting off must not spray errors)."""
    out: list[str] = []
    for command in sacct.commands(job_ids):
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = proc.stdout.splitlines() if proc.returncode == 0 else []
        out.extend(lines if not out else lines[1:])
    return "".join(f"{line}\n" for line in out)


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


def _controller(job_ids: list[str]) -> dict[str, str]:
    """The controller's JobState of each id it knows: one id is asked alone, more ids through one
    listing of every job (`scontrol show job -o`, one line a job) read for the ids asked."""
    if not job_ids:
        return {}
    command = ["scontrol", "show", "job", "-o", *job_ids[:1]] if len(job_ids) == 1 else None
    try:
        out = subprocess.run(
            command or ["scontrol", "show", "job", "-o"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if command:
        found = _fields(out.split("\n", 1)[0]).get("JobState")
        return {job_ids[0]: found} if found else {}
    return {k: v for k, v in listing(out).items() if k in job_ids}


def _fields(line: str) -> dict[str, str]:
    return dict(f.split("=", 1) for f in line.split() if "=" in f)


def listing(text: str) -> dict[str, str]:
    """JobState by job id in `scontrol show job -o` output: a plain job by its id, an array element
    by ARRAY_INDEX (a pending range record, ArrayTaskId=1-5%2, names each of its elements) and by
    its own JobId, an array's id by its first record (as `scontrol show job -o ARRAY` answers)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        f = _fields(line)
        job, value = f.get("JobId"), f.get("JobState")
        if not job or not value:
            continue
        out.setdefault(job, value)
        array, tasks = f.get("ArrayJobId"), f.get("ArrayTaskId")
        if array and tasks:
            out.setdefault(array, value)
            for n in sacct.indexes(tasks.split("%")[0]):
                out[f"{array}_{n}"] = value
    return out


def cancel(job_id: str) -> None:
    cancel_ids([job_id])


def cancel_ids(job_ids: list[str]) -> None:
    """scancel every job in `job_ids`: one call (sacct.CHUNK ids a call)."""
    for i in range(0, len(job_ids), sacct.CHUNK):
        part = job_ids[i : i + sacct.CHUNK]
        proc = subprocess.run(["scancel", *part], capture_output=True, text=True)
        if proc.returncode != 0:
            shown = " ".join(part[:3]) + (" ..." if len(part) > 3 else "")
            raise UserError(f"scancel {shown} failed: {proc.stderr.strip()}")


def _run_state(run: RunDir, look: Callable[[str], str]) -> str:
    """The run's state, `look(job_id)` giving one job's."""
    job_id = run.last_job_id()
    if not job_id:
        return states.UNKNOWN
    value = look(job_id)
    segments = chain.ids(run)
    if value not in LIVE and job_id in segments:
        # a chain between two segments: the one that ended its part is done, the next still
        # queued (seen under load: COMPLETED read in that window, while the chain went on).
        # The segments after the one asked about, not after the current one: the batch shell
        # may have written segment_end meanwhile, and then the current one is the next.
        for later in segments[segments.index(job_id) + 1 :]:
            if (next_state := look(later)) in LIVE:
                return next_state
    if value == states.UNKNOWN and any(
        e.get("event") == "cancel" and e.get("job_id") == job_id for e in run.events()
    ):
        # an array task cancelled while pending leaves no record in sacct or scontrol
        return states.CANCELLED
    return value


def _ids(run: RunDir) -> list[str]:
    """Every job id the run's state can need (its current job, a chain's segments)."""
    last = run.last_job_id()
    return [*([last] if last else []), *chain.ids(run)]


class Slurm:
    def submit(self, run: RunDir, profile: ResolvedProfile, *, time_min: int) -> str:
        return submit(run)

    def state(self, run: RunDir) -> str:
        # one job at a time, as asked (a chain's next segments only in the window between two)
        return _run_state(run, lambda job_id: state(job_id))

    def states(self, runs: list[RunDir]) -> dict[RunDir, str]:
        """Many runs' states from one Query; a run whose folder cannot be read is left out (its
        own state() says why)."""
        ids: dict[RunDir, list[str]] = {}
        for run in runs:
            try:
                ids[run] = _ids(run)
            except Exception:  # noqa: BLE001 - a broken folder: left to state(), one run at a time
                continue
        ask = Query(j for each in ids.values() for j in each)
        out: dict[RunDir, str] = {}
        for run in ids:
            try:
                out[run] = _run_state(run, ask.state)
            except Exception:  # noqa: BLE001 - as above
                continue
        return out

    def cancel(self, run: RunDir) -> str:
        for job_id in chain.cancel_ids(run) or [run.last_job_id() or ""]:  # a chain: all left
            if job_id:
                mark_cancel(run, job_id)
                cancel(job_id)
                run.event("cancel", job_id=job_id)
        return self.state(run)

    def cancel_many(self, runs: list[RunDir]) -> dict[RunDir, str]:
        """Cancel each run's job (a chain: every segment left) with one scancel; the states after."""
        marked: list[tuple[RunDir, str]] = []
        for run in runs:
            for job_id in chain.cancel_ids(run) or [run.last_job_id() or ""]:
                if job_id:
                    mark_cancel(run, job_id)
                    marked.append((run, job_id))
        cancel_ids([job_id for _, job_id in marked])
        for run, job_id in marked:
            run.event("cancel", job_id=job_id)
        return self.states(runs)

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
