"""A rank's own record of why it failed, torch-free: `failures/<job>-<restart>/rank-<R>.json`.

train_entry writes it when an exception ends a rank (a SIGKILL writes nothing: torchrun's
root-cause block or srun's `task 3: Killed` line says that). `hpctrain status` reads it
(hpctrain/runs/cause.py) to tell the rank that failed first from the ranks that only lost a peer:
those die too, a moment later, and the launcher often notices them first.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from hpctrain.kernel import jobenv, layout
from hpctrain.kernel.rundir import RunFolder

# what a collective says when another rank went away or did not answer in time (gloo, NCCL, the
# c10d store, torchrun's wrapper): the consequence of a failure elsewhere, never its cause, and
# worth an in-job restart (kernel/fatal.py)
LOST_PEER = (
    "connection closed by peer",
    "connection reset by peer",
    "connection refused",
    "broken pipe",
    "connectfullmesh",
    "pair closure",
    "communicator was aborted",
    "ncclremoteerror",
    "ncclsystemerror",
    "remote process exited",
    "timed out",
    "timeout",  # gloo's connect, NCCL's watchdog ("collective operation timeout")
    "childfailederror",
    "another rank failed first",
)


def lost_peer(text: str) -> bool:
    low = text.lower()
    return any(m in low for m in LOST_PEER)


def folder(job_id: str, restart: str | int) -> str:
    """The records of one start (the same <job>-<restart> as stacks/ and preflight/)."""
    return f"{layout.FAILURES}/{job_id}-{restart}"


def record(run_dir: str | Path, rank: int, error: str) -> None:
    """Write this rank's record: {"rank", "node", "host", "time", "error", "lost_peer"}.
    `error`: the exception's line as a traceback ends (`ValueError: d_model must be even`)."""
    job = jobenv.get(jobenv.JOB_ID, "none")
    restart = jobenv.get(jobenv.RESTART_COUNT, "0")
    node = jobenv.get(jobenv.NODEID)
    fields = {
        "rank": rank,
        "node": int(node) if node and node.isdigit() else None,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "time": time.time(),  # sub-second: two ranks of one failure are a few ms apart
        "error": error[:500],
        "lost_peer": lost_peer(error),
    }
    RunFolder(Path(run_dir)).write(
        f"{folder(job, restart)}/rank-{rank}.json", json.dumps(fields) + "\n", durable=False
    )
