"""The choice: the guides' decision tree and out-of-memory ladder over the memory model, and the
Recommendation that `submit --strategy auto` uses."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import TypedDict

from hpctrain.kernel import strategies
from hpctrain.kernel.errors import UserError
from hpctrain.plan.inputs import workload
from hpctrain.plan.model import (
    BY_NAME,
    CUDA_CONTEXT_BYTES,
    GIB,
    HEADROOM,
    LADDER,
    LAYOUTS,
    Estimate,
    Layout,
    Workload,
    estimate,
)
from hpctrain.plan.parallel import Candidate, assume_shape, choose, ring
from hpctrain.plan.snapshots import SnapshotPlan, plan_snapshots


@dataclass(kw_only=True)
class Recommendation:
    """What `hpctrain plan` and `submit --strategy auto` choose."""

    name: str
    strategy: str  # ddp | fsdp | deepspeed
    zero_stage: int | None
    offload: str  # none | optimizer | optimizer+params | nvme
    precision: str
    micro_batch: int | None
    grad_accumulation: int  # keeps the asked global batch when micro_batch was reduced
    activation_checkpointing: bool
    reason: str
    total_bytes_per_gpu: int
    # the mesh (DP fills the rest): tp x pp x dp = world; schedule etc. only when pp > 1
    tp: int = 1
    pp: int = 1
    dp: int | None = None
    schedule: str | None = None
    microbatches: int | None = None
    bubble: float | None = None
    offload_lost: str = ""  # why the first offload rung lost to tp x pp (when one was chosen)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


class Rung(TypedDict):
    """One rung of the ladder the plan walked."""

    name: str  # the layout
    rung: str  # what was tried: "as asked", "micro-batch 4", ...
    fits: bool
    total_bytes_per_gpu: int
    why: str


@dataclass
class Plan:
    workload: Workload
    estimates: list[Estimate]
    ladder: list[Rung] = field(default_factory=list)
    recommendation: Recommendation | None = None
    parallel: list[Candidate] = field(default_factory=list)  # tp x pp x dp layouts, best first

    def to_dict(self) -> dict[str, object]:
        wl = self.workload
        rec = self.recommendation
        return {
            "inputs": {**asdict(wl), "world_size": wl.world},
            "usable_bytes_per_gpu": wl.usable_bytes,
            "headroom": HEADROOM,
            "cuda_context_bytes": CUDA_CONTEXT_BYTES,
            "strategies": [e.to_dict() for e in self.estimates],
            "ladder": self.ladder,
            "recommended": rec.name if rec else None,
            "recommendation": asdict(rec) if rec else None,
            "layout": (
                {
                    "tp": rec.tp,
                    "pp": rec.pp,
                    "dp": rec.dp,
                    "schedule": rec.schedule,
                    "microbatches": rec.microbatches,
                    "bubble": rec.bubble,
                }
                if rec
                else None
            ),
            "parallel": [c.to_dict() for c in self.parallel],
            "snapshots": snap.to_dict() if (snap := for_plan(self)) else None,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)


def for_plan(plan: Plan) -> SnapshotPlan | None:
    """The snapshots of `hpctrain plan`'s recommendation (None when nothing fits)."""
    rec, wl = plan.recommendation, plan.workload
    if rec is None:
        return None
    return plan_snapshots(
        strategy=rec.strategy,
        params=wl.params,
        nodes=wl.nodes,
        gpus=wl.gpus,
        optimizer=wl.optimizer,
        tp=rec.tp,
        pp=rec.pp,
        node_mem_bytes=wl.host_mem_bytes,
    )


def gib(n: int | float | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f} GiB"


def _levers(wl: Workload) -> list[tuple[str, str, int | None, bool]]:
    """The ladder's activation rungs: (label, precision, micro_batch, checkpointing), cumulative."""
    mb = wl.micro_batch
    steps = [("as asked", wl.precision, mb, False)]
    if not wl.has_activations:
        return steps
    prec = wl.precision
    while mb is not None and mb > 1:
        mb //= 2
        steps.append((f"micro-batch {mb}", prec, mb, False))
    if prec == "fp32":
        prec = "bf16"
        steps.append((f"micro-batch {mb}, bf16 mixed precision", prec, mb, False))
    steps.append((f"micro-batch {mb}, {prec}, activation checkpointing", prec, mb, True))
    return steps


def make_plan(wl: Workload) -> Plan:
    """Estimate every layout, then walk the ladder and keep the first rung that fits."""
    if wl.params <= 0:
        raise UserError("the model has no parameters: pass --params N (> 0) or a --model factory")
    if wl.nodes < 1 or wl.gpus < 1:
        raise UserError(f"--nodes {wl.nodes} --gpus {wl.gpus}: both must be at least 1")
    if wl.usable_bytes <= 0:
        raise UserError(
            f"{gib(wl.gpu_mem_bytes)} per GPU leaves nothing after the "
            f"{gib(CUDA_CONTEXT_BYTES)} CUDA context and {HEADROOM:.0%} headroom"
        )
    wl = assume_shape(wl)
    plan = Plan(wl, [estimate(lay, wl) for lay in LAYOUTS])
    ddp = estimate(BY_NAME["ddp"], wl)
    chosen, plan.parallel = choose(wl)
    for name in LADDER:
        lay = BY_NAME[name]
        if lay.offload != "none" and chosen is not None:
            # the decision tree's last branch: before offload, tensor x pipeline parallel
            plan.ladder.append(
                Rung(
                    name=chosen.name,
                    rung="activation checkpointing"
                    if chosen.activation_checkpointing
                    else "as asked",
                    fits=True,
                    total_bytes_per_gpu=chosen.total_bytes_per_gpu,
                    why=_mp_why(chosen, wl),
                )
            )
            plan.recommendation = _mp_recommendation(chosen, wl, plan)
            return plan
        plan.recommendation = _climb(plan, lay, ddp=ddp)
        if plan.recommendation is not None:
            return plan
    return plan


def _climb(plan: Plan, lay: Layout, *, ddp: Estimate) -> Recommendation | None:
    """One layout's rungs (as asked, then the activation levers) into the plan's ladder, up to
    the first that fits: its recommendation, DP filling the world; None when none fits."""
    wl, usable = plan.workload, plan.workload.usable_bytes
    e = estimate(lay, wl)
    state = e.model_state_bytes_per_gpu + e.transient_bytes
    if state > usable:  # no activation rung can help: go straight to the next strategy
        why = f"{gib(state)} model state + gathered vs {gib(usable)} usable"
        plan.ladder.append(
            Rung(
                name=lay.name,
                rung="model state alone",
                fits=False,
                total_bytes_per_gpu=state,
                why=why,
            )
        )
        return None
    for label, prec, mb, ck in _levers(wl):
        e = estimate(lay, wl, precision=prec, micro_batch=mb)
        act = (e.activation_bytes_per_gpu_checkpointed if ck else e.activation_bytes_per_gpu) or 0
        total = e.model_state_bytes_per_gpu + e.transient_bytes + act
        fits = e.fits_with_checkpointing if ck else e.fits
        why = (
            f"{gib(e.model_state_bytes_per_gpu)} model state + {gib(e.transient_bytes)} gathered "
            f"+ {gib(act)} activations = {gib(total)} vs {gib(usable)} usable"
        )
        if wl.host_mem_bytes is not None and e.host_bytes_per_node:
            why += f"; host {gib(e.host_bytes_per_node)} per node of {gib(wl.host_mem_bytes)}"
        plan.ladder.append(
            Rung(name=lay.name, rung=label, fits=fits, total_bytes_per_gpu=total, why=why)
        )
        if fits:
            accum = max(1, (wl.micro_batch or 1) // (mb or 1))
            return Recommendation(
                name=lay.name,
                strategy=lay.strategy,
                zero_stage=lay.zero_stage,
                offload=lay.offload,
                precision=prec,
                micro_batch=mb,
                grad_accumulation=accum,
                activation_checkpointing=ck,
                reason=_reason(lay.name, rung=label, why=why, ddp=ddp, wl=wl, accum=accum),
                total_bytes_per_gpu=total,
                dp=wl.world,
            )
    return None


def _reason(name: str, *, rung: str, why: str, ddp: Estimate, wl: Workload, accum: int) -> str:
    n = wl.world
    tree = {
        "ddp": f"the model fits on one GPU, so DDP (fastest and simplest) across all {n} GPUs",
        "zero2": f"DDP's replica does not fit ({gib(ddp.model_state_bytes_per_gpu)} model state); "
        f"ZeRO-2 shards gradients and optimizer state over {n} GPUs",
        "fsdp": f"the model does not fit on one GPU but fits sharded over all {n} GPUs: "
        "FSDP (PyTorch-native ZeRO-3)",
        "zero3_offload": f"even fully sharded over {n} GPUs it does not fit: ZeRO-3 with the "
        "optimizer offloaded to host memory",
        "zero3_offload_params": "ZeRO-3 with optimizer and parameters offloaded to host memory",
        "zero3_nvme": "host memory is not enough either: ZeRO-3 with NVMe offload (slow; consider "
        "more GPUs or pipeline/tensor parallelism)",
    }[name]
    extra = "" if rung == "as asked" else f" after the ladder's earlier rungs ({rung})"
    if accum > 1:
        extra += f"; keep the global batch with gradient accumulation x{accum}"
    return f"{tree}{extra}: {why}"


def _mp_why(c: Candidate, wl: Workload) -> str:
    state = c.params_bytes + c.grads_bytes + c.optimizer_bytes
    return (
        f"{gib(state)} model state + {gib(c.transient_bytes)} gathered + "
        f"{gib(c.activation_bytes)} activations = {gib(c.total_bytes_per_gpu)} vs "
        f"{gib(wl.usable_bytes)} usable"
    )


def _mp_recommendation(c: Candidate, wl: Workload, plan: Plan) -> Recommendation:
    # the mesh's data-parallel strategy as the ladder estimated it (whole, no offload)
    fsdp = next(e for e in plan.estimates if e.strategy == strategies.MESH and e.offload == "none")
    domain = wl.domain or wl.gpus
    pipe = (
        f"pipeline parallel {c.pp} ({c.layers_per_stage} layers per stage, {c.schedule}, "
        f"{c.microbatches} micro-batches, bubble {c.bubble:.1%})"
        if c.pp > 1
        else "no pipeline"
    )
    ck = ", activation checkpointing" if c.activation_checkpointing else ""
    dp = f"FSDP over data parallel {c.dp}" if c.dp > 1 else "data parallel 1 (no GPUs left for it)"
    reason = (
        f"even fully sharded over {wl.world} GPUs the model does not fit (FSDP: "
        f"{gib(fsdp.model_state_bytes_per_gpu)} model state + {gib(fsdp.transient_bytes)} "
        f"gathered + {gib(fsdp.activation_bytes_per_gpu_checkpointed)} checkpointed activations): "
        f"tensor parallel {c.tp} inside each {domain}-GPU fast-link domain, {pipe}, "
        f"{dp}{ck}: {_mp_why(c, wl)}; of the layouts that fit it sends the least between "
        f"nodes ({gib(c.slow_bytes_per_step)} per GPU per step)"
    )
    return Recommendation(
        name=c.name,
        strategy=strategies.MESH,  # the DP dimension (train_entry's FSDP2 over the dp mesh)
        zero_stage=None,
        offload="none",
        precision=c.precision,
        micro_batch=wl.micro_batch,
        grad_accumulation=c.microbatches if c.pp == 1 else 1,
        activation_checkpointing=c.activation_checkpointing,
        reason=reason,
        total_bytes_per_gpu=c.total_bytes_per_gpu,
        tp=c.tp,
        pp=c.pp,
        dp=c.dp,
        schedule=c.schedule if c.pp > 1 else None,
        microbatches=c.microbatches if c.pp > 1 else None,
        bubble=c.bubble if c.pp > 1 else None,
        offload_lost=_offload_lost(c, wl),
    )


def _offload_lost(c: Candidate, wl: Workload) -> str:
    """Why the ladder's first offload rung lost: what it would cost against the chosen layout."""
    off = estimate(BY_NAME["zero3_offload"], wl, precision=c.precision)
    n, w = wl.world, 4 if c.precision == "fp32" else 2
    pcie = math.ceil(wl.params / n) * (4 + w)  # fp32 gradients to the host, parameters back
    gathers = ring(n) * wl.params * (2 * w + 4) if wl.nodes > 1 else 0
    host = (
        f" of {gib(wl.host_mem_bytes)}"
        if wl.host_mem_bytes is not None
        else " (the nodes' host memory is not known)"
    )
    return (
        f"{c.name} fits on the GPUs, so offload is not needed; zero3_offload would hold "
        f"{gib(off.host_bytes_per_node)} of host memory per node{host}, move {gib(pcie)} per GPU "
        f"per step over PCIe with the optimizer step on the CPU, and send "
        f"{gib(int(gathers))} per GPU per step between nodes for its parameter gathers and "
        f"gradient reduce-scatter against {gib(c.slow_bytes_per_step)} here"
    )


def recommend(
    *,
    params: int | None = None,
    model: str | None = None,
    precision: str = "bf16",
    optimizer: str = "adamw",
    nodes: int = 1,
    gpus: int = 1,
    gpu_mem_gib: float | None = None,
    profile: str | None = None,
    micro_batch: int | None = None,
    seq_len: int | None = None,
    hidden: int | None = None,
    layers: int | None = None,
    heads: int | None = None,
    global_batch: int | None = None,
    schedule: str = "1f1b",
    domain: int | None = None,
) -> Recommendation:
    """The strategy for `hpctrain submit --strategy auto`.

    Give the model as `params` (a count) or `model` ("pkg.mod:factory", built on the meta device),
    the topology (`nodes` x `gpus` per node) and the GPU memory (`gpu_mem_gib`, else the profile's
    `slurm.gpu_mem_gib`; a profile without GPUs plans for CPU workers sharing this machine's RAM).
    Returns a Recommendation: `.strategy` (ddp|fsdp|deepspeed; the DP dimension), `.zero_stage`
    (None, 1, 2, 3), `.offload` (none|optimizer|optimizer+params|nvme), the mesh `.tp`, `.pp`, `.dp`
    (with `.schedule`, `.microbatches`, `.bubble` when pp > 1), `.reason`, and `.to_json()` (write
    it to the run folder's plan.json). The shape (`layers`, `hidden`, `heads`, `seq_len`,
    `micro_batch`) is assumed from the parameter count where not given; `domain` (GPUs joined by
    NVLink, else the profile's `slurm.gpus_per_domain`, else `gpus`) bounds tensor parallel.
    Raises UserError (exit 2) when no option fits or an input is missing.

        rec = recommend(params=124_000_000, nodes=2, gpus=8, profile="mycluster")
        rec.strategy, rec.zero_stage  # ("ddp", None)
    """
    plan = make_plan(
        workload(
            params=params,
            model=model,
            precision=precision,
            optimizer=optimizer,
            nodes=nodes,
            gpus=gpus,
            gpu_mem_gib=gpu_mem_gib,
            profile=profile,
            micro_batch=micro_batch,
            seq_len=seq_len,
            hidden=hidden,
            layers=layers,
            heads=heads,
            global_batch=global_batch,
            schedule=schedule,
            domain=domain,
        )
    )
    if plan.recommendation is None:
        raise UserError(no_fit_message(plan))
    return plan.recommendation


def no_fit_message(plan: Plan) -> str:
    wl = plan.workload
    return (
        f"no strategy fits {wl.params:,} parameters on {wl.nodes} node(s) x {wl.gpus} GPU(s) of "
        f"{gib(wl.gpu_mem_bytes)}, not even with pipeline/tensor parallelism: use more GPUs or "
        "nodes, or a smaller model"
    )
