"""Launchers: how the training processes are started inside the allocation.

One module per launcher, registered by name in hpctrain/kernel/plugins.py (LAUNCHERS), with the
function of `Launcher`; its part of the batch script is templates/launch/NAME.sh.j2, which places
the `LaunchPart` the function returns. `entry.py` (a user script's entry) and `rdzv.py` (the signed
rendezvous torchrun loads) run on the nodes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol, cast

from hpctrain.kernel.plugins import LAUNCHERS
from hpctrain.kernel.values import frozen

if TYPE_CHECKING:
    from hpctrain.kernel.shell import Sh
    from hpctrain.profiles.resolved import ResolvedProfile


@frozen
class LaunchPart:
    """What a launcher adds to the batch script. Words are shell-safe (`Sh`) as they are."""

    tasks_per_node: int
    """srun tasks on each node: 1 (torchrun) or one per GPU or worker (srun)."""
    step_options: tuple[str, ...] = ()
    """Extra srun options of the training step (plain words, quoted where they are placed)."""
    command: tuple[Sh, ...] = ()
    """The program each node's task execs (torchrun: launch.torchrun, or hpctrain's own)."""
    restarts: tuple[Sh, ...] = ()
    """The program's in-job restart options (torchrun: --max-restarts, --monitor-interval)."""
    options: tuple[Sh, ...] = ()
    """The site's own options for the program (launch.torchrun_args)."""
    rdzv_backend: str = ""
    """The rendezvous backend the program joins (torchrun: hpctrain's signed c10d)."""


class Launcher(Protocol):
    def part(self, profile: ResolvedProfile, gpus: int) -> LaunchPart:
        """The launcher's part of the batch script for `gpus` GPUs (or workers) per node."""


def get(name: str) -> Launcher:
    return cast("Launcher", importlib.import_module(LAUNCHERS[name]))
