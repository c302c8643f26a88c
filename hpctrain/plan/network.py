"""The network term of the plan's pick: bytes each GPU sends per step, inside and between nodes,
and an estimated step time that weighs them against the compute (docs/plan-and-doctor.md, "The
pick: bytes between nodes and the step time").

Bytes per GPU per step for the data-parallel layouts, N = GPUs, P parameters, w bytes of the
training dtype, m micro-batches per step (gradient accumulation), ring(N) = (N-1)/N:

| layout | bytes |
|---|---|
| ddp | all-reduce of fp32 gradients once per step: 2 ring(N) P 4 |
| zero1, zero2 | reduce-scatter of w gradients per micro-batch, all-gather of w parameters: ring(N) P (m w + w) |
| fsdp, zero3 (+ offload) | gathers forward and backward per micro-batch, fp32 reduce-scatter: ring(N) P (2 m w + 4) |

All of it crosses nodes when the run has more than one. The tp x pp x dp layouts' bytes are
hpctrain/plan/parallel.py's. Time: bytes / bus bandwidth (nccl-tests' busbw, GB/s: the time of a
collective is exactly the bytes each rank sends over it), and the step

    step = compute x (4/3 with activation checkpointing) / (1 - bubble) + TP + PP
           + max(0, DP - that compute)

compute = 6 P x tokens per step / (GPUs x effective FLOP/s): TP and PP sit on the critical path,
data-parallel traffic overlaps the compute (prefetched gathers, bucketed reductions) and only what
is longer shows. Pure arithmetic, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.kernel import strategies
from hpctrain.plan.model import Layout, Workload
from hpctrain.plan.parallel import Candidate, ring

# Stated assumptions, each replaced by a flag or the profile where known:
DEFAULT_INTER_GBPS = 100.0  # busbw between nodes (8 x 200 Gb/s NICs give ~190; Ethernet ~10-20)
DEFAULT_INTRA_GBPS = 300.0  # busbw inside a node over NVLink (A100 ~230, H100 ~450)
DEFAULT_TFLOPS = 300.0  # effective bf16 TFLOP/s per GPU (~40% of an H100's dense peak)
RECOMPUTE = 4 / 3  # full activation checkpointing repeats the forward: 8P instead of 6P FLOPs
# Model parallel needs a TP plan and a PP split for your own model and puts collectives on the
# critical path: it must save at least this share of the best data-parallel step to be chosen.
MP_MARGIN = 0.10


@dataclass(frozen=True, kw_only=True)
class Network:
    """Bandwidths and speed the pick uses, and which of them are assumed (not given)."""

    inter_gbps: float
    intra_gbps: float
    tflops: float
    assumed: tuple[str, ...] = ()

    def describe(self) -> str:
        said = (
            f"{self.inter_gbps:g} GB/s between nodes, {self.intra_gbps:g} GB/s inside a node, "
            f"{self.tflops:g} effective TFLOP/s per GPU"
        )
        if self.assumed:
            flags = ", ".join(f"--{a.replace('_', '-')}" for a in self.assumed)
            said += f" (assumed: give {flags} for your cluster)"
        return said


def network(wl: Workload) -> Network:
    assumed = tuple(
        name
        for name, value in (
            ("inter_gbps", wl.inter_gbps),
            ("intra_gbps", wl.intra_gbps),
            ("tflops", wl.tflops),
        )
        if value is None
    )
    return Network(
        inter_gbps=wl.inter_gbps or DEFAULT_INTER_GBPS,
        intra_gbps=wl.intra_gbps or DEFAULT_INTRA_GBPS,
        tflops=wl.tflops or DEFAULT_TFLOPS,
        assumed=assumed,
    )


@dataclass(frozen=True, kw_only=True)
class Cost:
    """One layout's estimated step, in seconds, and its bytes per GPU per step."""

    compute_s: float  # with recompute and the pipeline bubble
    tp_s: float
    pp_s: float
    dp_s: float  # all of it; what the compute does not hide adds to the step
    step_s: float
    inter_bytes: int  # sent per GPU per step between nodes
    intra_bytes: int
    recompute: bool = False  # activation checkpointing's second forward is in the compute
    bubble: float = 0.0  # and the pipeline's idle share

    @property
    def hidden_s(self) -> float:
        return min(self.dp_s, self.compute_s)

    def describe(self) -> str:
        within = [w for w, on in (("recompute", self.recompute), ("bubble", self.bubble)) if on]
        parts = [
            f"compute {self.compute_s:.2f} s" + (f" with {' and '.join(within)}" if within else "")
        ]
        if self.tp_s:
            parts.append(f"TP {self.tp_s:.2f} s inside the node")
        if self.pp_s:
            parts.append(f"PP {self.pp_s:.2f} s")
        if self.dp_s:
            shown = self.dp_s - self.hidden_s
            parts.append(
                f"data parallel {self.dp_s:.2f} s ({shown:.2f} s not hidden by the compute)"
            )
        return f"~{self.step_s:.2f} s per step ({', '.join(parts)})"


def tokens(wl: Workload) -> int:
    """Tokens per optimizer step: the global batch (else GPUs x micro-batch) x the sequence."""
    return (wl.global_batch or wl.world * (wl.micro_batch or 1)) * (wl.seq_len or 1)


def compute_s(wl: Workload, net: Network, *, checkpointing: bool, bubble: float = 0.0) -> float:
    flops = 6 * wl.params * tokens(wl) * (RECOMPUTE if checkpointing else 1.0)
    return flops / (wl.world * net.tflops * 1e12) / (1 - bubble)


def dp_bytes(layout: Layout, wl: Workload, *, precision: str, accum: int = 1) -> int:
    """Bytes each GPU sends per step under a data-parallel layout (the table above)."""
    n = wl.world
    if n == 1:
        return 0
    w = 4 if precision == "fp32" else 2
    info = strategies.info(layout.strategy)
    if not info.sharded and not info.zero:  # ddp: a whole replica, gradients all-reduced
        return int(2 * ring(n) * wl.params * 4)
    if info.zero and layout.zero_stage in (1, 2):
        return int(ring(n) * wl.params * (accum * w + w))
    return int(ring(n) * wl.params * (2 * accum * w + 4))


def dp_cost(
    layout: Layout, wl: Workload, net: Network, *, precision: str, checkpointing: bool, accum: int
) -> Cost:
    sent = dp_bytes(layout, wl, precision=precision, accum=accum)
    between = wl.nodes > 1
    dp = sent / ((net.inter_gbps if between else net.intra_gbps) * 1e9)
    comp = compute_s(wl, net, checkpointing=checkpointing)
    return Cost(
        compute_s=comp,
        tp_s=0.0,
        pp_s=0.0,
        dp_s=dp,
        step_s=comp + max(0.0, dp - comp),
        inter_bytes=sent if between else 0,
        intra_bytes=0 if between else sent,
        recompute=checkpointing,
    )


def mesh_cost(c: Candidate, wl: Workload, net: Network) -> Cost:
    inter, intra = net.inter_gbps * 1e9, net.intra_gbps * 1e9
    pp = c.pp_bytes_per_step / (inter if "pp" in c.crosses_nodes else intra)
    dp = c.dp_bytes_per_step / (inter if "dp" in c.crosses_nodes else intra)
    comp = compute_s(wl, net, checkpointing=c.activation_checkpointing, bubble=c.bubble)
    tp = c.tp_bytes_per_step / intra
    total = c.tp_bytes_per_step + c.pp_bytes_per_step + c.dp_bytes_per_step
    return Cost(
        compute_s=comp,
        tp_s=tp,
        pp_s=pp,
        dp_s=dp,
        step_s=comp + tp + pp + max(0.0, dp - comp),
        inter_bytes=c.slow_bytes_per_step,
        intra_bytes=total - c.slow_bytes_per_step,
        recompute=c.activation_checkpointing,
        bubble=c.bubble,
    )
