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


STRATEGIES: dict[str, StrategyInfo] = {
    s.name: s
    for s in (
        StrategyInfo("ddp", "DistributedDataParallel", "dcp", reshards=True, async_save=True),
        StrategyInfo("fsdp", "FSDP2 (fully_shard)", "dcp", reshards=True, async_save=True),
        StrategyInfo(
            "deepspeed",
            "DeepSpeed ZeRO (its engine)",
            "engine",
            reshards=False,
            async_save=False,
            parse_check=True,
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
