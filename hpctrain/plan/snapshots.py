"""In-memory snapshots' node-local memory, planned before the job (docs/recovery.md).

Per node: ranks per node x ((own + the partner's copy, on more than one node) x KEEP steps, + the
newest step sent to the partner on more than one node) x one rank's state. A rank's state is what a
disk checkpoint holds, through the same state dict: its fp32 parameters and optimizer state (the
memory model's params + optimizer bytes, hpctrain/plan/model.py: DDP keeps fp32 params under
autocast and FSDP2 fp32 shards, so the precision does not change it); the loop state and RNG add a
few KiB, not counted. It fits when it is at most MEMORY_SHARE of /dev/shm, a tmpfs of SHM_SHARE of
the node's memory by default. The first snapshot of the run checks the same sum against the
folder's real free memory (train_entry/snapshot.py) and turns snapshots off when it does not fit;
the constants are hpctrain/kernel/snapshot.py's, shared by both. Pure Python, no torch.
"""

from __future__ import annotations

from hpctrain.kernel import jobenv, strategies
from hpctrain.kernel import snapshot as store
from hpctrain.kernel.values import frozen
from hpctrain.plan.model import GIB, Layout, model_state

FOLDER = "/dev/shm"  # where the plan assumes them (jobenv.SNAPSHOT_DIR moves them)
# Without the node's memory (no slurm.mem, no --host-mem-gib) the plan assumes this many bytes of
# host memory per byte of the node's GPU memory (DGX A100/H100: 2 TiB for 8 x 80 GiB, 3.2) and
# warns when the snapshots would not fit that either.
HOST_PER_GPU_MEM = 2.0
FIRST = 'train.log: "snapshots in memory every N step(s): X MiB per rank"'


def rank_state_bytes(
    strategy: str, *, params: int, world: int, optimizer: str, tp: int = 1, pp: int = 1
) -> int | None:
    """One rank's snapshot: fp32 parameters + optimizer state of what it holds (ddp: the whole
    replica; fsdp: its shard of P/(tp x pp) over the dp = world/(tp x pp) ranks). None under
    DeepSpeed: its engine owns the state, so it takes no snapshots."""
    info = strategies.STRATEGIES.get(strategy)
    if info is None or strategies.engine_checkpoint(strategy):
        return None
    if not info.mesh:  # the strategy holds the whole model: no tp or pp
        tp = pp = 1
    # CPU offload too: the same fp32 state, only elsewhere
    whole = Layout(strategy, strategy, None, "none", info.summary)
    p, _, o, _ = model_state(
        whole,
        params=-(-params // (tp * pp)),
        world=max(1, world // (tp * pp)),
        precision="fp32",
        optimizer=optimizer,
    )
    return p + o


@frozen(kw_only=True)
class SnapshotPlan:
    """What snapshots will take on each node, and whether it fits."""

    strategy: str
    nodes: int
    ranks_per_node: int
    rank_bytes: int | None  # one rank's state; None: measured at the first snapshot
    node_mem_bytes: int | None  # the node's memory; None: not known
    every_steps: int | None = None  # snapshot.every_steps: None auto, 0 off, N
    gpu_mem_bytes: int | None = None  # per GPU: for the assumed node memory when it is not known
    budget: float = store.BUDGET
    kept: int = store.KEEP

    @property
    def copies(self) -> int:
        """Own, and a partner's copy when the run spans more than one node."""
        return 2 if self.nodes > 1 else 1

    @property
    def node_bytes(self) -> int | None:
        if self.rank_bytes is None:
            return None
        return store.node_bytes(
            self.rank_bytes, ranks_per_node=self.ranks_per_node, partner=self.copies > 1
        )

    @property
    def allowed_bytes(self) -> int | None:
        """MEMORY_SHARE of /dev/shm, itself SHM_SHARE of the node's memory."""
        if self.node_mem_bytes is None:
            return None
        return int(self.node_mem_bytes * store.SHM_SHARE * store.MEMORY_SHARE)

    @property
    def assumed_mem_bytes(self) -> int | None:
        """The node memory assumed when it is not known: HOST_PER_GPU_MEM x its GPUs' memory."""
        if self.node_mem_bytes is not None or not self.gpu_mem_bytes:
            return None
        return int(HOST_PER_GPU_MEM * self.ranks_per_node * self.gpu_mem_bytes)

    @property
    def status(self) -> str:
        """off | none (DeepSpeed) | unknown_size | unknown_memory | likely_too_large (more than
        the allowed share of an assumed node memory) | fits | too_large"""
        if self.every_steps == 0:
            return "off"
        if strategies.engine_checkpoint(self.strategy):
            return "none"
        need, allowed = self.node_bytes, self.allowed_bytes
        if need is None:
            return "unknown_size"
        if allowed is None:
            assumed = self.assumed_mem_bytes
            if assumed is not None and need > assumed * store.SHM_SHARE * store.MEMORY_SHARE:
                return "likely_too_large"
            return "unknown_memory"
        return "fits" if need <= allowed else "too_large"

    @property
    def fits(self) -> bool | None:
        return {"fits": True, "too_large": False}.get(self.status)

    def to_dict(self) -> dict[str, object]:
        return {
            "status": self.status,
            "fits": self.fits,
            "strategy": self.strategy,
            "every_steps": self.every_steps,
            "nodes": self.nodes,
            "ranks_per_node": self.ranks_per_node,
            "copies": self.copies,
            "kept": self.kept,
            "rank_bytes": self.rank_bytes,
            "node_bytes": self.node_bytes,
            "node_mem_bytes": self.node_mem_bytes,
            "assumed_node_mem_bytes": self.assumed_mem_bytes,
            "allowed_bytes": self.allowed_bytes,
            "memory_share": store.MEMORY_SHARE,
            "shm_share": store.SHM_SHARE,
            "line": self.line(),
        }

    def line(self, *, interval: bool = False) -> str:
        """One line for `hpctrain plan` and `submit --dry-run` (`interval`: say how often)."""
        head, status = "in-memory snapshots", self.status
        if interval and status not in ("off", "none"):
            head += (
                f" (every {self.every_steps} steps)"
                if self.every_steps
                else f" (interval auto: at most {self.budget:.0%} of a step)"
            )
        if status == "off":
            return (
                f"{head}: off (snapshot.every_steps=0): an in-job restart loads the disk checkpoint"
            )
        if status == "none":
            return (
                f"{head}: none under DeepSpeed (its engine owns the state): an in-job restart "
                "loads the disk checkpoint"
            )
        copy = "own + partner copy" if self.copies > 1 else "own copy (one node: no partner)"
        what = f"{self.ranks_per_node} rank(s) x ({copy} x {self.kept} kept" + (
            " + the newest step sent to the partner)" if self.copies > 1 else ")"
        )
        allowed = (
            f"{_gib(self.allowed_bytes)} allowed ({store.MEMORY_SHARE:.0%} of {FOLDER}, "
            f"{store.SHM_SHARE:.0%} of the node's {_gib(self.node_mem_bytes)})"
        )
        if status == "unknown_size":
            limit = (
                f"within {allowed}"
                if self.allowed_bytes is not None
                else f"checked then against {store.MEMORY_SHARE:.0%} of the free memory"
            )
            return (
                f"{head}: size measured at the first snapshot ({FIRST}); per node {what}, {limit}"
            )
        size = f"{_gib(self.node_bytes)} per node in {FOLDER} ({what} x {_gib(self.rank_bytes)})"
        if status == "unknown_memory":
            return (
                f"{head}: {size}; the node's memory is not known (the profile's slurm.mem; "
                "plan: --host-mem-gib): the first snapshot checks it against "
                f"{store.MEMORY_SHARE:.0%} of the free memory"
            )
        if status == "likely_too_large":
            assumed = self.assumed_mem_bytes or 0
            share = store.SHM_SHARE * store.MEMORY_SHARE
            return (
                f"{head}: {size}: WARNING: likely too large: the node's memory is not known (the "
                f"profile's slurm.mem; plan: --host-mem-gib), and against an assumed "
                f"{_gib(assumed)} ({HOST_PER_GPU_MEM:g} x its {self.ranks_per_node} x "
                f"{_gib(self.gpu_mem_bytes)} of GPU memory) that is over the "
                f"{_gib(int(assumed * share))} allowed ({share:.0%} of it); if so the first "
                "snapshot turns them off; give the node's memory to check, FSDP more nodes "
                f"(smaller shards), {jobenv.SNAPSHOT_DIR} a larger node-local folder, or turn them "
                "off with --snapshot.every_steps=0"
            )
        if status == "fits":
            return f"{head}: {size} of {allowed}: fits"
        return (
            f"{head}: {size} of {allowed}: does not fit, so they will be off (the first snapshot "
            "checks; an in-job restart loads the disk checkpoint); give a node more memory, "
            f"{jobenv.SNAPSHOT_DIR} a larger node-local folder, FSDP more nodes (smaller "
            "shards), or turn them off with --snapshot.every_steps=0"
        )


def plan_snapshots(
    *,
    strategy: str,
    params: int | None,
    nodes: int,
    gpus: int,
    optimizer: str = "adamw",
    tp: int = 1,
    pp: int = 1,
    node_mem_bytes: int | None = None,
    every_steps: int | None = None,
    budget: float = store.BUDGET,
    gpu_mem_bytes: int | None = None,
) -> SnapshotPlan:
    """The snapshot plan of a run: `params` None when the model's size is not known before it
    is built (a factory's model, a user script); `gpu_mem_bytes` (per GPU) sizes the assumed node
    memory when `node_mem_bytes` is not known."""
    rank = (
        None
        if params is None
        else rank_state_bytes(
            strategy, params=params, world=nodes * gpus, optimizer=optimizer, tp=tp, pp=pp
        )
    )
    return SnapshotPlan(
        strategy=strategy,
        nodes=nodes,
        ranks_per_node=gpus,
        rank_bytes=rank,
        node_mem_bytes=node_mem_bytes,
        every_steps=every_steps,
        budget=budget,
        gpu_mem_bytes=gpu_mem_bytes,
    )


def node_memory_gib(
    mem: str | None, *, gpu_mem_gib: float | None, gpus: int | None
) -> float | None:
    """A node's memory in GiB from a profile's slurm section: slurm.mem; a profile without GPUs
    (local, CPU workers) runs on this machine: its RAM; else None (not known)."""
    host = _parse_mem(mem)
    if host is None and gpu_mem_gib is None and not gpus:
        return meminfo_gib()
    return host


def _parse_mem(text: str | None) -> float | None:
    """Slurm --mem ("480G", "500000M", "0" = all) in GiB; None when unknown or "all"."""
    if text in (None, "", "0"):
        return None
    s = str(text).strip().upper()
    units = {"K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0}
    try:
        if s[-1] in units:
            return float(s[:-1]) * units[s[-1]]
        return float(s) / 1024  # Slurm's default unit is MiB
    except ValueError:
        return None


def meminfo_gib() -> float | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return None


def _gib(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"
