"""JobOptions: what the command line asked for, typed, built once by the CLI (render, submit,
sweep) and handed down as it is; the service layer, the sweep and the remote path read it, and
nothing passes an options dict. The profile and the JobRequest are resolved from it
(hpctrain/service/prepare.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from hpctrain.kernel.values import frozen


@frozen
class JobOptions:
    profile: str | None = None
    """--profile: a site profile name or YAML path (None: the default profile)."""
    name: str | None = None
    """--name: the run (or sweep) name, its folder's name."""
    nodes: int | None = None
    gpus: int | None = None
    """GPUs per node (local profile: CPU workers per simulated node)."""
    min_nodes: int | None = None
    spare_nodes: int | None = None
    """--spare-nodes: hot spares, the profile's preemption.spare_nodes for this run."""
    exclude: tuple[str, ...] = ()
    time_min: int | None = None
    """--time in minutes (None: the profile's slurm.default_time_min)."""
    strategy: str | None = None
    script: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()
    """The entry's arguments (after `--`)."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gpu_type: str | None = None
    """--gpu-type: slurm.gpu_type for this run (`A100`: `--gpus-per-node=A100:4`)."""
    sets: tuple[str, ...] = ()
    """--set KEY=VALUE profile overrides."""
    params: int | None = None
    """--strategy auto: the model's parameter count."""
    plan_model: str | None = None
    """--strategy auto: the model factory pkg.mod:fn (--model)."""
    wait: bool = False
    dry_run: bool = False
    replace_finished: bool = False
    chain: bool = False
    sync: str | None = None
    """Remote site: the folder sent as the code instead of the git tree."""
    code: str | None = None
    """On the site: the uploaded code folder (hidden option)."""
    grid: tuple[str, ...] = ()
    """sweep: the axes, KEY=V1,V2,..."""
    max_parallel: int | None = None
    """sweep: at most K points at once."""

    @classmethod
    def of(cls, params: Mapping[str, object]) -> JobOptions:
        """From click's parameters (names as the options' destinations); tuples stay tuples."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - names)
        if unknown:
            raise TypeError(f"JobOptions has no field {', '.join(unknown)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in params.items()})  # type: ignore[arg-type]
