"""Shifter (NERSC): the image is pulled for the job by `#SBATCH --image`, modules such as
`gpu,nccl-plugin` come from `#SBATCH --module`, and each task enters it through `shifter`.

    #SBATCH --image=IMAGE
    #SBATCH --module=gpu,nccl-plugin
    srun ... shifter --volume="SRC:DST" ... [--workdir="DIR"] [flags] bash -c NODE_CMD
"""

from __future__ import annotations

from hpctrain.kernel.shell import Sh, option, quote
from hpctrain.profiles.schema.environment import Container


def sbatch(c: Container) -> list[str]:
    out = [f"--image={c.image}"]
    if c.modules:
        out.append("--module=" + ",".join(c.modules))
    return out


def srun_options(c: Container, mounts: list[str], gpu: str | None) -> list[Sh]:
    return []


def prefix(c: Container, mounts: list[str], gpu: str | None) -> list[Sh]:
    out = [Sh("shifter")] + [option("--volume", m) for m in mounts]
    if c.workdir:
        out.append(option("--workdir", c.workdir))
    return out + [quote(f) for f in c.flags]
