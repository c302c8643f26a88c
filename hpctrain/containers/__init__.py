"""Container kinds: how every task enters the site's container.

One module per kind, registered by name in hpctrain/kernel/plugins.py (CONTAINERS). A module has
the three functions of `ContainerKind`; `mounts` are SRC:DST[:OPTS] (bare paths already doubled),
the run folder included; `gpu` is "nvidia", "amd" or None.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol, cast

from hpctrain.kernel.plugins import CONTAINERS

if TYPE_CHECKING:
    from hpctrain.kernel.shell import Sh
    from hpctrain.profiles.schema.environment import Container


class ContainerKind(Protocol):
    def sbatch(self, c: Container) -> list[str]:
        """Extra #SBATCH directives (shifter's --image)."""

    def srun_options(self, c: Container, mounts: list[str], gpu: str | None) -> list[Sh]:
        """srun options (pyxis, edf); words already shell-safe."""

    def prefix(self, c: Container, mounts: list[str], gpu: str | None) -> list[Sh]:
        """Words before `bash -c NODE_CMD` (apptainer, shifter)."""


def get(kind: str) -> ContainerKind:
    return cast("ContainerKind", importlib.import_module(CONTAINERS[kind]))
