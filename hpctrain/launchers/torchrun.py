"""launcher torchrun: one srun task per node runs torchrun, which starts one worker per GPU and joins
the c10d rendezvous on the head node. The site may name its own torchrun (a wrapper with the same
flags) and add torchrun options."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.kernel import jobenv, jobkey
from hpctrain.kernel.shell import Sh, shvalue
from hpctrain.launchers import LaunchPart

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile


MONITOR_S = 0.5  # seconds between the agent's looks at its workers (torch's default 0.1 in 2.13)


def part(profile: ResolvedProfile, gpus: int) -> LaunchPart:
    launch = profile.launch
    if launch.torchrun:
        command = tuple(shvalue(w) for w in launch.torchrun.split(" "))
    else:
        command = (Sh(f'"${jobenv.PYTHON}"'), Sh("-m"), Sh("hpctrain.launchers.rdzv"))
    return LaunchPart(
        tasks_per_node=1,
        command=command,
        # in-job restarts: the agent restarts every node's workers (c10d rendezvous); a small
        # monitor interval notices a dead worker fast
        restarts=(
            Sh(f"--max-restarts={profile.preemption.max_in_job_restarts}"),
            Sh(f"--monitor-interval={MONITOR_S}"),
        ),
        options=tuple(_option(a) for a in launch.torchrun_args),
        rdzv_backend=jobkey.RDZV_BACKEND,  # c10d, its state signed (launchers/rdzv.py)
    )


def _option(arg: str) -> Sh:
    """`--key=value` with the value's variables expanding on the node; `--flag` as it is."""
    key, eq, value = arg.partition("=")
    return Sh(key + ("=" + shvalue(value) if eq else ""))
