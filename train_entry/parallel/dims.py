"""The device mesh of a run: ("pp", "dp", "tp") from the kernel's layout, and this rank's place.

Built only for a run with tp or pp (`Layout.parallel`); a data-parallel run keeps its plain
process group and every size here is the trivial one, so ddp/fsdp runs are untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from hpctrain.kernel import mesh as layouts
from train_entry.config import TrainConfig


@dataclass
class ParallelDims:
    layout: layouts.Layout
    rank: int
    mesh: DeviceMesh | None = None  # None without tp/pp

    @classmethod
    def build(
        cls, cfg: TrainConfig, *, rank: int, world_size: int, device: torch.device
    ) -> ParallelDims:
        layout = layouts.Layout.of(world_size, cfg.parallel.tp, cfg.parallel.pp)
        if not layout.parallel:
            return cls(layout, rank)
        grid = init_device_mesh(device.type, layout.shape, mesh_dim_names=layouts.DIMS)
        return cls(layout, rank, grid)

    def _local(self, dim: str) -> int:
        return int(self.mesh[dim].get_local_rank()) if self.mesh is not None else 0

    def sub(self, dim: str) -> DeviceMesh:
        """The mesh's `dim` dimension (a run with tp or pp has a mesh)."""
        assert self.mesh is not None, "a data-parallel run has no device mesh"
        return self.mesh[dim]

    @property
    def dp_rank(self) -> int:
        """Which data shard this rank reads: tp and pp peers read the same one."""
        return self._local("dp") if self.mesh is not None else self.rank

    @property
    def dp(self) -> int:
        return self.layout.dp

    @property
    def pp_rank(self) -> int:
        return self._local("pp")

    @property
    def tp_rank(self) -> int:
        return self._local("tp")

    def describe(self) -> str:
        return self.layout.describe()
