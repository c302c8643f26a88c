"""The strategy names: the only list of them. Each name is one module in train_entry/strategies/.

A strategy's facts that the torch-free side needs (checkpoint format, whether a checkpoint reshards)
live here too, so the CLI and the checkpoint format never spell a name.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StrategyInfo:
    name: str
    summary: str
    checkpoint: str  # "dcp" (torch.distributed.checkpoint) or "engine" (the strategy saves itself)
    reshards: bool  # its checkpoints load at another world size
    async_save: bool  # the checkpointer may save it asynchronously
    parse_check: bool = False  # its module checks the config at parse time (Strategy.validate)
    mesh: bool = (
        False  # it is the data-parallel dimension of a device mesh with tp/pp (kernel/mesh)
    )
    no_mesh: str = ""  # when not: why and the fix, said when a run asks for tp/pp with it


STRATEGIES: dict[str, StrategyInfo] = {
    s.name: s
    for s in (
        StrategyInfo(
            "ddp",
            "DistributedDataParallel",
            "dcp",
            reshards=True,
            async_save=True,
            no_mesh="DDP wraps a plain module and tp/pp turn parameters into DTensors and the "
            "model into stages; use --strategy fsdp (FSDP2 is the data-parallel dimension of the "
            "mesh; its checkpoints load into ddp runs and back)",
        ),
        StrategyInfo(
            "fsdp", "FSDP2 (fully_shard)", "dcp", reshards=True, async_save=True, mesh=True
        ),
        StrategyInfo(
            "deepspeed",
            "DeepSpeed ZeRO (its engine)",
            "engine",
            reshards=False,
            async_save=False,
            parse_check=True,
            no_mesh="DeepSpeed's ZeRO engine owns the model and its partitioning and takes no "
            "device mesh; use --strategy fsdp for tp/pp, or keep deepspeed with "
            "parallel.tp=1 and parallel.pp=1",
        ),
    )
}
NAMES: tuple[str, ...] = tuple(STRATEGIES)  # what train_entry runs
AUTO = "auto"  # submit/plan only: let the planner choose
CHOICES: tuple[str, ...] = (*NAMES, AUTO)  # what `hpctrain submit --strategy` accepts
DEFAULT = "ddp"


def info(name: str) -> StrategyInfo:
    return STRATEGIES[name]


def engine_checkpoint(name: str | None) -> bool:
    """The strategy saves and loads its own checkpoint files (not through DCP). A name read from a
    manifest may be unknown: not an engine checkpoint then."""
    found = STRATEGIES.get(name or "")
    return found is not None and found.checkpoint == "engine"
