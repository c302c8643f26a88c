"""The choice: the guides' decision tree and out-of-memory ladder over the memory model, and the
Recommendation that `submit --strategy auto` uses."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import TypedDict

from hpctrain.kernel import strategies
from hpctrain.kernel.errors import UserError
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
from hpctrain.plan.network import MP_MARGIN, Cost, Network, dp_bytes, dp_cost, mesh_cost, network
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
    step_s: float | None = None  # the estimated step (hpctrain/plan/network.py)
    between_nodes_bytes: int | None = None  # sent per GPU per step between nodes

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
    network: Network | None = None  # the bandwidths and speed the pick assumed

    def between_nodes(self, e: Estimate) -> int:
        """What a data-parallel layout sends per GPU per step between nodes, as asked."""
        lay = BY_NAME[e.name]
        return dp_bytes(lay, self.workload, precision=self.workload.precision) * (
            self.workload.nodes > 1
        )

    def to_dict(self) -> dict[str, object]:
        wl = self.workload
        rec = self.recommendation
        return {
            "inputs": {**asdict(wl), "world_size": wl.world},
            "usable_bytes_per_gpu": wl.usable_bytes,
            "headroom": HEADROOM,
            "cuda_context_bytes": CUDA_CONTEXT_BYTES,
            "strategies": [
                {**e.to_dict(), "between_nodes_bytes_per_step": self.between_nodes(e)}
                for e in self.estimates
            ],
            "network": asdict(self.network) if self.network else None,
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
        gpu_mem_bytes=wl.gpu_mem_bytes,
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
    """Estimate every layout, walk the ladder, and pick by the estimated step time: the first
    data-parallel rung that fits (DDP, else FSDP) unless a tensor x pipeline layout sends less
    between nodes and saves at least MP_MARGIN of its step (hpctrain/plan/network.py); offload
    only when nothing fits on the GPUs."""
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
    net = network(wl)
    plan = Plan(wl, [estimate(lay, wl) for lay in LAYOUTS], network=net)
    ddp = estimate(BY_NAME["ddp"], wl)
    chosen, plan.parallel = choose(wl, lambda c: mesh_cost(c, wl, net).step_s)
    for name in LADDER:
        lay = BY_NAME[name]
        if lay.offload != "none":
            break
        rec = _climb(plan, lay, ddp=ddp)
        if rec is None:
            continue
        cost = dp_cost(
            lay,
            wl,
            net,
            precision=rec.precision,
            checkpointing=rec.activation_checkpointing,
            accum=rec.grad_accumulation,
        )
        rec.step_s, rec.between_nodes_bytes = cost.step_s, cost.inter_bytes
        if (
            chosen is not None
            and chosen.slow_bytes_per_step < cost.inter_bytes  # it moves traffic off the slow link
            and chosen.step_s < cost.step_s * (1 - MP_MARGIN)
        ):
            plan.recommendation = _mp_recommendation(chosen, wl, plan, lost=(rec, cost))
        else:
            rec.reason += f"; {cost.describe()}" + _mp_lost(chosen, wl, net, cost)
            plan.recommendation = rec
        return plan
    if chosen is not None:  # the decision tree's last branch: before offload, tensor x pipeline
        plan.recommendation = _mp_recommendation(chosen, wl, plan, lost=None)
        return plan
    for name in LADDER:
        lay = BY_NAME[name]
        if lay.offload != "none":
            plan.recommendation = _climb(plan, lay, ddp=ddp)
            if plan.recommendation is not None:
                return plan
    return plan


def _mp_lost(chosen: Candidate | None, wl: Workload, net: Network, dp: Cost) -> str:
    """Why the best tensor x pipeline layout lost to data parallel (in figures)."""
    if chosen is None:
        return ""
    mp = mesh_cost(chosen, wl, net)
    why = (
        f"not {MP_MARGIN:.0%} below it"
        if mp.inter_bytes < dp.inter_bytes
        else "and it sends no less between nodes"
    )
    return (
        f"; the best tensor x pipeline layout, {chosen.name}, would take {mp.describe()}, {why} "
        f"(between nodes {gib(mp.inter_bytes)} per GPU per step against {gib(dp.inter_bytes)}; "
        f"{net.describe()})"
    )


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
        "FSDP (PyTorch-native ZeRO-3; core, where ZeRO-2 would need DeepSpeed, an optional "
        "install)",
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


def _mp_recommendation(
    c: Candidate, wl: Workload, plan: Plan, *, lost: tuple[Recommendation, Cost] | None
) -> Recommendation:
    """The tp x pp layout's recommendation; `lost`: the data-parallel one that fit but was
    slower (else none fit)."""
    # the mesh's data-parallel strategy as the ladder estimated it (whole, no offload)
    fsdp = next(e for e in plan.estimates if e.strategy == strategies.MESH and e.offload == "none")
    domain = wl.domain or wl.gpus
    net = plan.network or network(wl)
    cost = mesh_cost(c, wl, net)
    pipe = (
        f"pipeline parallel {c.pp} ({c.layers_per_stage} layers per stage, {c.schedule}, "
        f"{c.microbatches} micro-batches, bubble {c.bubble:.1%})"
        if c.pp > 1
        else "no pipeline"
    )
    ck = ", activation checkpointing" if c.activation_checkpointing else ""
    dp = f"FSDP over data parallel {c.dp}" if c.dp > 1 else "data parallel 1 (no GPUs left for it)"
    if lost is None:
        head = (
            f"even fully sharded over {wl.world} GPUs the model does not fit (FSDP: "
            f"{gib(fsdp.model_state_bytes_per_gpu)} model state + {gib(fsdp.transient_bytes)} "
            f"gathered + {gib(fsdp.activation_bytes_per_gpu_checkpointed)} checkpointed "
            "activations)"
        )
    else:
        rec, dcost = lost
        head = (
            f"{rec.name} fits ({gib(rec.total_bytes_per_gpu)}) but takes {dcost.describe()}, "
            f"sending {gib(dcost.inter_bytes)} per GPU per step between nodes; this layout "
            f"saves {1 - cost.step_s / dcost.step_s:.0%} of the step"
        )
    reason = (
        f"{head}: tensor parallel {c.tp} inside each {domain}-GPU fast-link domain, {pipe}, "
        f"{dp}{ck}: {_mp_why(c, wl)}; {cost.describe()}, {gib(c.slow_bytes_per_step)} per GPU "
        f"per step between nodes: the shortest estimated step of the layouts that fit "
        f"({net.describe()})"
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
        step_s=cost.step_s,
        between_nodes_bytes=c.slow_bytes_per_step,
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


def no_fit_message(plan: Plan) -> str:
    wl = plan.workload
    return (
        f"no strategy fits {wl.params:,} parameters on {wl.nodes} node(s) x {wl.gpus} GPU(s) of "
        f"{gib(wl.gpu_mem_bytes)}, not even with pipeline/tensor parallelism: use more GPUs or "
        "nodes, or a smaller model"
    )
