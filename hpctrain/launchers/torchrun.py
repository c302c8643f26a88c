"""launcher torchrun: one srun task per node runs torchrun, which starts one worker per GPU and joins
the c10d rendezvous on the head node. The site may name its own torchrun (a wrapper with the same
flags) and add torchrun options."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpctrain.kernel import jobenv, jobkey
from hpctrain.render.shellwords import Sh, shvalue

if TYPE_CHECKING:
    from hpctrain.jobs.request import JobRequest
    from hpctrain.profiles.resolved import ResolvedProfile


MONITOR_S = 0.5  # seconds between the agent's looks at its workers (torch's default 0.1 in 2.13)


def tasks_per_node(req: JobRequest) -> int:
    return 1


def step_options(profile: ResolvedProfile, req: JobRequest) -> list[str]:
    return []


def context(profile: ResolvedProfile, req: JobRequest) -> dict[str, Any]:
    launch = profile.launch
    if launch.torchrun:
        command = [shvalue(w) for w in launch.torchrun.split(" ")]
    else:
        command = [Sh(f'"${jobenv.PYTHON}"'), Sh("-m"), Sh("hpctrain.launchers.rdzv")]
    return {
        "torchrun_command": command,
        "rdzv_backend": jobkey.RDZV_BACKEND,  # c10d, its state signed (launchers/rdzv.py)
        # in-job restarts: the agent restarts every node's workers (c10d rendezvous); a small
        # monitor interval notices a dead worker fast
        "torchrun_restarts": [
            Sh(f"--max-restarts={profile.preemption.max_in_job_restarts}"),
            Sh(f"--monitor-interval={MONITOR_S}"),
        ],
        "torchrun_args": [
            Sh(a.split("=", 1)[0] + ("=" + shvalue(a.split("=", 1)[1]) if "=" in a else ""))
            for a in launch.torchrun_args
        ],
    }
