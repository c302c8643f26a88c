"""The strategy names: the only list of them. Each name is one module in train_entry/strategies/.

A strategy's facts that the torch-free side needs (checkpoint format, whether a checkpoint reshards,
how a rank holds the model state) live here too, so the CLI, the checkpoint format and the planner
never spell a name.
"""

from __future__ import annotations

from hpctrain.kernel.values import frozen

# The parts of a rank's model state (what a strategy replicates or shards).
PARAMS, GRADS, OPTIMIZER = "params", "grads", "optimizer"


@frozen(kw_only=True)
class StrategyInfo:
    name: str
    summary: str
    checkpoint: str  # "dcp" (torch.distributed.checkpoint) or "engine" (the strategy saves itself)
    reshards: bool  # its checkpoints load at another world size
    async_save: bool  # the checkpointer may save it asynchronously
    parse_check: bool = False  # its module checks the config at parse time (Strategy.validate)
    # it is the data-parallel dimension of a device mesh with tp/pp (kernel/mesh)
    mesh: bool = False
    no_mesh: str = ""  # when not: why and the fix, said when a run asks for tp/pp with it
    no_shrink: str = ""  # why its run cannot continue on fewer nodes (--min-nodes), and the fix
    cpu_offload: bool = False  # its config has a CPU offload switch (--NAME.cpu_offload)
    # The model state each rank holds only its 1/N share of (the rest: a whole copy each).
    sharded: tuple[str, ...] = ()
    zero: bool = False  # DeepSpeed ZeRO: its stage (1-3) decides `sharded` (hpctrain/plan/model.py)
    # Parameters and gradients in the training dtype, with an fp32 master copy in the optimizer
    # state; else they stay fp32 (autocast, FSDP2's MixedPrecisionPolicy cast per use).
    master_copy: bool = False


STRATEGIES: dict[str, StrategyInfo] = {
    s.name: s
    for s in (
        StrategyInfo(
            name="ddp",
            summary="DistributedDataParallel",
            checkpoint="dcp",
            reshards=True,
            async_save=True,
            no_mesh="DDP wraps a plain module and tp/pp turn parameters into DTensors and the "
            "model into stages; use --strategy fsdp (FSDP2 is the data-parallel dimension of the "
            "mesh; its checkpoints load into ddp runs and back)",
        ),
        StrategyInfo(
            name="fsdp",
            summary="FSDP2 (fully_shard)",
            checkpoint="dcp",
            reshards=True,
            async_save=True,
            mesh=True,
            sharded=(PARAMS, GRADS, OPTIMIZER),
            cpu_offload=True,
        ),
        StrategyInfo(
            name="deepspeed",
            summary="DeepSpeed ZeRO (its engine)",
            checkpoint="engine",
            reshards=True,  # another world size: its universal checkpoint (train_entry)
            async_save=False,
            parse_check=True,
            no_mesh="DeepSpeed's ZeRO engine owns the model and its partitioning and takes no "
            "device mesh; use --strategy fsdp for tp/pp, or keep deepspeed with "
            "parallel.tp=1 and parallel.pp=1",
            zero=True,
            master_copy=True,
        ),
    )
}
NAMES: tuple[str, ...] = tuple(STRATEGIES)  # what train_entry runs
AUTO = "auto"  # submit/plan only: let the planner choose
CHOICES: tuple[str, ...] = (*NAMES, AUTO)  # what `hpctrain submit --strategy` accepts
DEFAULT = "ddp"
# The data-parallel dimension under tp/pp: what the planner recommends with them.
MESH = next(s.name for s in STRATEGIES.values() if s.mesh)


def info(name: str) -> StrategyInfo:
    return STRATEGIES[name]


def engine_checkpoint(name: str | None) -> bool:
    """The strategy saves and loads its own checkpoint files (not through DCP). A name read from a
    manifest may be unknown: not an engine checkpoint then."""
    found = STRATEGIES.get(name or "")
    return found is not None and found.checkpoint == "engine"
