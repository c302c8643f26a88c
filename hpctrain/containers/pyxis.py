"""pyxis (NVIDIA's enroot through Slurm's SPANK plugin): the container is an srun option set.

srun --container-image="IMAGE" --container-mounts="SRC:DST,..." [--container-workdir="DIR"]
     [--container-env=NAME,...] [flags] bash -c NODE_CMD
"""

from __future__ import annotations

from hpctrain.kernel.shell import Sh, option, quote
from hpctrain.profiles.schema.environment import Container


def sbatch(c: Container) -> list[str]:
    return []


def srun_options(c: Container, mounts: list[str], gpu: str | None) -> list[Sh]:
    out = [option("--container-image", c.image), option("--container-mounts", ",".join(mounts))]
    if c.workdir:
        out.append(option("--container-workdir", c.workdir))
    if c.env:
        out.append(option("--container-env", ",".join(c.env)))
    return out + [quote(f) for f in c.flags]


def prefix(c: Container, mounts: list[str], gpu: str | None) -> list[Sh]:
    return []
