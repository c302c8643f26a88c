"""An environment definition file (CSCS Alps' container engine): a TOML file names the image,
mounts, working directory and hooks; srun enters it with one option.

    srun --environment="NAME_OR_PATH" [flags] bash -c NODE_CMD

The EDF must mount the runs folder (hpctrain cannot add a mount to it).
"""

from __future__ import annotations

from typing import Any

from hpctrain.render.shellwords import Sh, option, quote


def sbatch(c: Any) -> list[str]:
    return []


def srun_options(c: Any, mounts: list[str], gpu: str | None) -> list[Sh]:
    return [option("--environment", c.image)] + [quote(f) for f in c.flags]


def prefix(c: Any, mounts: list[str], gpu: str | None) -> list[Sh]:
    return []
