"""Container kinds: how every task enters the site's container.

One module per kind; this table is the only list of them (the schema's `environment.container.kind`
takes its names from here). A module provides, for a validated `Container` and the render inputs:

    sbatch(c) -> list[str]                  extra #SBATCH directives (shifter's --image)
    srun_options(c, mounts, gpu) -> list    srun options (pyxis, edf); words already shell-safe
    prefix(c, mounts, gpu) -> list          words before `bash -c NODE_CMD` (apptainer, shifter)

`mounts` are SRC:DST[:OPTS] (bare paths already doubled), the run folder included; `gpu` is
"nvidia", "amd" or None. To add one: write hpctrain/containers/NAME.py and add a line here.
"""

from __future__ import annotations

import importlib
from types import ModuleType

KINDS = {
    "pyxis": "hpctrain.containers.pyxis",  # enroot through srun --container-*
    "apptainer": "hpctrain.containers.apptainer",  # apptainer exec|run IMAGE
    "singularity": "hpctrain.containers.apptainer",  # the same program under its older name
    "shifter": "hpctrain.containers.shifter",  # #SBATCH --image, srun shifter
    "edf": "hpctrain.containers.edf",  # srun --environment=EDF (CSCS container engine)
}


def get(kind: str) -> ModuleType:
    return importlib.import_module(KINDS[kind])
