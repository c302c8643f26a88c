"""launcher srun: one srun task per GPU (per worker on CPU nodes); each task is a training process.

Inside each task the per-node command sets what torchrun's agent would have: RANK from
SLURM_PROCID, LOCAL_RANK from SLURM_LOCALID, WORLD_SIZE from SLURM_NTASKS, LOCAL_WORLD_SIZE,
GROUP_RANK from SLURM_NODEID, MASTER_ADDR/MASTER_PORT from the rendezvous head; the entry then joins
with torch's env:// init (train_entry and user scripts alike). With `launch.task_gpus:
gpus-per-task` every task gets one GPU (`--gpus-per-task=1`): it sees one device, and train_entry
takes LOCAL_RANK modulo the visible devices."""

from __future__ import annotations

from typing import Any


def tasks_per_node(req: Any) -> int:
    return req.gpus


def step_options(profile: Any, req: Any) -> list[str]:
    if profile.slurm.gpus_per_node and profile.launch.task_gpus == "gpus-per-task":
        return ["--gpus-per-task=1"]
    return []


def context(profile: Any, req: Any) -> dict[str, Any]:
    return {}
