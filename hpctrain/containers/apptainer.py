"""apptainer and singularity: the container is a command in front of the node command.

    srun ... BINARY exec|run [--nv|--rocm] --bind "SRC:DST" ... [--pwd "DIR"] [flags] "IMAGE" bash -c NODE_CMD

The GPU flag follows slurm.gpu_vendor (`--nv` for NVIDIA, `--rocm` for AMD), only when the
profile has GPUs. The binary is the kind's name unless `container.binary` names another.
"""

from __future__ import annotations

from hpctrain.kernel.shell import Sh, quote, shvalue
from hpctrain.profiles.schema.environment import Container

GPU_FLAG = {"nvidia": "--nv", "amd": "--rocm"}


def sbatch(c: Container) -> list[str]:
    return []


def srun_options(c: Container, mounts: list[str], gpu: str | None) -> list[Sh]:
    return []


def prefix(c: Container, mounts: list[str], gpu: str | None) -> list[Sh]:
    out = [shvalue(c.binary) if c.binary else quote(c.kind), quote(c.exec)]
    if gpu:
        out.append(Sh(GPU_FLAG[gpu]))
    for m in mounts:
        out += [Sh("--bind"), shvalue(m)]
    if c.workdir:
        out += [Sh("--pwd"), shvalue(c.workdir)]
    return out + [quote(f) for f in c.flags] + [shvalue(c.image)]
