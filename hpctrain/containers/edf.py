"""An environment definition file (CSCS Alps' container engine): a TOML file names the image,
mounts, working directory and hooks; srun enters it with one option.

    srun --environment="NAME_OR_PATH" [flags] bash -c NODE_CMD

The EDF must mount the runs folder (hpctrain cannot add a mount to it).
"""

from __future__ import annotations

from hpctrain.kernel.shell import Sh, option, quote
from hpctrain.profiles.schema.environment import Container


def sbatch(c: Container) -> list[str]:
    return []


def srun_options(c: Container, mounts: list[str], gpu: str | None) -> list[Sh]:
    return [option("--environment", c.image)] + [quote(f) for f in c.flags]


def prefix(c: Container, mounts: list[str], gpu: str | None) -> list[Sh]:
    return []
