"""launcher srun: one srun task per GPU (per worker on CPU nodes); each task is a training process.

Inside each task the per-node command sets what torchrun's agent would have: RANK from
SLURM_PROCID, LOCAL_RANK from SLURM_LOCALID, WORLD_SIZE from SLURM_NTASKS, LOCAL_WORLD_SIZE,
GROUP_RANK from SLURM_NODEID, MASTER_ADDR/MASTER_PORT from the rendezvous head; the entry then joins
with torch's env:// init (train_entry and user scripts alike). With `launch.task_gpus:
gpus-per-task` (or `gpu-bind`, for a `--gres` site: `--gpu-bind=single:1`) every task gets one
GPU: it sees one device, and train_entry takes LOCAL_RANK modulo the visible devices (a user script
that uses `cuda:$LOCAL_RANK` needs the default, `none`: every GPU of the node visible)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.launchers import LaunchPart

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile

TASK_GPUS = {"gpus-per-task": "--gpus-per-task=1", "gpu-bind": "--gpu-bind=single:1"}


def part(profile: ResolvedProfile, gpus: int) -> LaunchPart:
    option = TASK_GPUS.get(profile.launch.task_gpus)
    step = (option,) if option and profile.slurm.gpus_per_node else ()
    return LaunchPart(tasks_per_node=gpus, step_options=step)
