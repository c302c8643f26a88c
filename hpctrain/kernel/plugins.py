"""The plug-in registry: every scheduler, launcher and container kind by the name a profile gives
it, and the module that holds it. This table is the only list of them: the profile schema takes
its names from here, and each kind's package loads the module behind its checked Protocol
(`dispatch.Scheduler`, `launchers.Launcher`, `containers.ContainerKind`). To add one: write the
module, add its line here (a launcher also needs its template part, templates/launch/NAME.sh.j2)."""

from __future__ import annotations

SCHEDULERS = {  # profile `scheduler:` -> the module holding SCHEDULER
    "slurm": "hpctrain.dispatch.slurm",
    "local": "hpctrain.dispatch.local",
}

LAUNCHERS = {  # profile `launch.launcher:` -> its module
    "torchrun": "hpctrain.launchers.torchrun",  # one srun task per node, torchrun starts the workers
    "srun": "hpctrain.launchers.srun",  # one srun task per GPU, the task is the worker
}

CONTAINERS = {  # profile `environment.container.kind:` -> its module
    "pyxis": "hpctrain.containers.pyxis",  # enroot through srun --container-*
    "apptainer": "hpctrain.containers.apptainer",  # apptainer exec|run IMAGE
    "singularity": "hpctrain.containers.apptainer",  # the same program under its older name
    "shifter": "hpctrain.containers.shifter",  # #SBATCH --image, srun shifter
    "edf": "hpctrain.containers.edf",  # srun --environment=EDF (CSCS container engine)
}
