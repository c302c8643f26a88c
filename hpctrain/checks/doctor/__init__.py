"""Pre-flight checks of a node (no torch): interface, name resolution, port, InfiniBand, GPUs,
scontrol, shared memory; and the report that names each failure's likely cause and fix, after the
guides' NCCL troubleshooting table (timeouts, P2P, wrong interface, small /dev/shm in containers).

`hpctrain doctor` runs them here for the local profile, or as a short job through the same rendered
script as `submit` (entry `python -m hpctrain.checks.doctor.worker`) for a Slurm profile.
"""

from __future__ import annotations

import os  # noqa: F401  (tests patch os through this module)

from hpctrain.checks.doctor.checks import *  # noqa: F403
from hpctrain.checks.doctor.net import *  # noqa: F403
from hpctrain.checks.doctor.net import _in_iface, _ioctl_ipv4, _is_loopback  # noqa: F401
from hpctrain.checks.doctor.report import *  # noqa: F403


def __getattr__(name: str):  # type: ignore[no-untyped-def]
    """The runners live in the service layer (hpctrain/checks/doctor/service.py); kept reachable here."""
    if name in ("run_local", "run_slurm", "pick_port", "collect_sweep"):
        # lazy: a real cycle: service.py imports this package
        from hpctrain.checks.doctor import service

        return getattr(service, name)
    raise AttributeError(name)
