"""The FATAL file: an error that will repeat, so an in-job restart would only fail again.

A worker that dies of a lost peer (a rank killed, a node gone, a collective or a gloo connect that
timed out) is restarted inside the job (`preemption.max_in_job_restarts`). An error that comes
back at every start (an exception in the training code, a bad config, a checkpoint that does not
load, a disk that is full) is not: the first rank to meet it writes `FATAL` (its cause, one line),
a restarted worker that finds the file leaves at once, and the batch shell stops the step and ends
the job FAILED with that cause. The batch shell removes the file at each start of the job.

Torch-free (the kernel): exceptions are told apart by their type's name and message.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from hpctrain.kernel import exitcodes, failures, jobenv, layout

# torch.distributed's own errors: the network or the store failed, not the training code
_LOST_TYPES = ("DistNetworkError", "DistStoreError", "DistBackendError")


def lost_peer(e: BaseException) -> bool:
    """A failure another rank (or the network) caused: worth a restart, never FATAL."""
    name, text = type(e).__name__, str(e)
    if name in _LOST_TYPES:
        return True
    return name == "RuntimeError" and failures.lost_peer(text)


def cause(e: BaseException, rank: str | int) -> str:
    """One line: who failed how ("rank 1 on n1: ValueError: boom")."""
    first = (str(e).strip().splitlines() or [""])[0][:300]
    return (
        f"rank {rank} on {socket.gethostname()}: {type(e).__name__}{': ' + first if first else ''}"
    )


def write(run_dir: str | Path, line: str) -> bool:
    """Record the cause; the first rank to get here wins (later ones are the same error or its
    echo). False when another rank wrote it first or the folder cannot be written."""
    try:
        fd = os.open(Path(run_dir) / layout.FATAL, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return False
    try:  # a full disk may leave the file empty: it still says "do not restart"
        with os.fdopen(fd, "w") as f:
            f.write(" ".join(line.split()) + "\n")
    except OSError:
        return False
    return True


def read(run_dir: str | Path) -> str | None:
    """The recorded cause ("" when it could not be written), or None when no error that repeats
    happened in this job start."""
    try:
        return (Path(run_dir) / layout.FATAL).read_text().strip()
    except OSError:
        return None


def refused_start(run_dir: str | Path) -> tuple[int, str] | None:
    """(exit code, one line) when a worker started in this job start must not train, else None.

    FATAL: an error that repeats was met (exit 1; its writer already said the cause). The STOP
    file: a stop was asked (exit 75, the newest checkpoint stands). torchrun restarts workers that
    left 75 after their save like any other failure, and each restart would train to the next step
    boundary and save again, spending the grace time. The batch shell removes both files at each
    start of the job, so what is found is this start's."""
    if jobenv.get(jobenv.JOB_ID) is None:
        return None
    if read(run_dir) is not None:
        return 1, "hpctrain: not started again: this job met an error that repeats (FATAL)"
    stop = jobenv.get(jobenv.STOP_FILE)
    if restarts() > 0 and stop and os.path.exists(stop):  # a first start trains to its stop
        return 75, "hpctrain: not started again: a stop was asked in this job (exit 75)"
    return None


def launcher_leaves(run_dir: str | Path) -> tuple[int, str] | None:
    """(exit code, one line) when a node's torchrun agent, about to start a new rendezvous round
    (its workers left, or another node's did), must leave instead; else None.

    After a stop every new round is wasted: each restarted worker only leaves again (refused_start).
    Worse, it is a race: once one node's agent is gone (the batch shell ends the step), another one
    inside the round waits in a c10d store call for a key that never comes, 60 s, where no SIGTERM
    reaches it (seen: 68-71 s from the save to the requeue, 3 of 3 under load). So the agent leaves
    before the round: 0 when the stop's checkpoint is committed (the PREEMPTED file tells the batch
    shell to requeue, as launcher srun's tasks do), 75 when a stop was asked but no rank saved yet
    (the newest checkpoint stands), 1 after an error that repeats (FATAL)."""
    if jobenv.get(jobenv.JOB_ID) is None:
        return None
    if read(run_dir) is not None:
        return 1, "hpctrain: this node's launcher leaves: the job met an error that repeats (FATAL)"
    stop = jobenv.get(jobenv.STOP_FILE)
    if not stop or not os.path.exists(stop):
        return None
    if (Path(run_dir) / layout.PREEMPTED).exists():
        return 0, "hpctrain: the stop's checkpoint is committed: this node's launcher leaves"
    return exitcodes.PREEMPTED, "hpctrain: a stop was asked: this node's launcher leaves (exit 75)"


def left_preempted(code: int) -> None:
    """A worker leaving PREEMPTED (75: its stop's checkpoint is committed; the save ends with a
    barrier, so every rank's part is) marks the run folder (layout.PREEMPTED). The batch shell then
    ends the step: torchrun would start every worker again (--max-restarts), each only to leave 75
    too (refused_start), spending the grace time before the time limit or the preemption's kill
    (measured under load: 2 restarts, 20 s, a chain segment ended TIMEOUT)."""
    run_dir = jobenv.get(jobenv.RUN_DIR)
    if code != exitcodes.PREEMPTED or not run_dir or jobenv.get(jobenv.JOB_ID) is None:
        return
    try:
        (Path(run_dir) / layout.PREEMPTED).touch()
    except OSError:
        pass  # the batch shell still ends the step when torchrun gives up


# the events.jsonl event of a node swapped for a hot spare (the preflight gate writes it; the
# restart it causes is recorded by hpctrain/runtime/recovery.py, `status` reads it)
SPARE_SWAPPED = "spare_swapped"
TORCHRUN_RESTARTS = "TORCHELASTIC_RESTART_COUNT"  # torchrun's agent sets it in every worker


def restarts() -> int:
    """This worker's in-job restart count: torchrun's restarts of its workers in this step plus
    the batch shell's new steps (launcher srun's restarts, a hot spare swapped in)."""
    total = 0
    for value in (os.environ.get(TORCHRUN_RESTARTS), jobenv.get(jobenv.IN_JOB_RESTART)):
        total += int(value) if value and value.isdigit() else 0
    return total
