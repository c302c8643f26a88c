"""Launchers: how the training processes are started inside the allocation.

One module per launcher; this table is the only list of them (the profile schema's
`launch.launcher` takes its names from here). A module provides:

    tasks_per_node(req) -> int                      srun tasks on each node
    step_options(profile, req) -> list[str]         extra srun options for the launch step
    context(profile, req) -> dict                   values the template's launcher block uses

To add one: write hpctrain/launchers/NAME.py, add a line here, add its block to the template.
"""

from __future__ import annotations

import importlib
from types import ModuleType

LAUNCHERS = {
    "torchrun": "hpctrain.launchers.torchrun",  # one srun task per node, torchrun starts the workers
    "srun": "hpctrain.launchers.srun",  # one srun task per GPU, the task is the worker
}


def get(name: str) -> ModuleType:
    return importlib.import_module(LAUNCHERS[name])
