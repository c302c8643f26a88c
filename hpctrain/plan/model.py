"""Per-GPU memory model and strategy choice: the guides' decision tree and out-of-memory ladder.

Pure Python: torch is imported only to count a `--model` factory's parameters on the meta device.

What each strategy holds per rank, for P parameters, N data-parallel ranks, w bytes per element of
the training dtype (4 fp32, 2 bf16/fp16) and k optimizer bytes per parameter (AdamW 8, SGD with
momentum 4, plain SGD 0). These are what the implementations hold, measured (tests/test_plan_memory.py),
not the ZeRO paper's idealised figures:

| name | params | grads | optimizer (+ fp32 master) |
|---|---|---|---|
| ddp (torch autocast keeps fp32 params) | 4P | 4P | kP |
| fsdp (FSDP2 shards stay fp32; MixedPrecisionPolicy casts per unit) | 4P/N | 4P/N | kP/N |
| zero1, zero2 (DeepSpeed reduces grads into the owner's partition at a boundary) | wP | wP/N | (k+4)P/N |
| zero3 | wP/N | wP/N | (k+4)P/N |

DeepSpeed keeps its own fp32 master partition even in fp32 training (the "+4"). Offload variants move
the optimizer (and fp32 grads) or also the parameters to host memory or NVMe.
"""

from __future__ import annotations

import math
from dataclasses import asdict

from hpctrain.kernel import strategies
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.strategies import GRADS, OPTIMIZER, PARAMS
from hpctrain.kernel.values import frozen, mutable

GIB = 1024**3
HEADROOM = 0.12  # allocator fragmentation, communication buckets, temporaries
CUDA_CONTEXT_BYTES = 1 * GIB  # CUDA context + NCCL buffers, held before the first tensor
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "sgd", "sgd-momentum")
OPT_BYTES = {"adamw": 8, "sgd": 0, "sgd-momentum": 4}
# Korthikanti et al. 2022, "Reducing Activation Recomputation": a transformer layer stores about
# 34*s*b*h bytes of 16-bit activations with fused (flash) attention, i.e. 17 elements per s*b*h.
ACT_ELEMS_PER_LAYER = 17
DEFAULT_UNITS = (
    24  # wrapped units (layers) assumed for the gathered-parameter estimate without --layers
)


@frozen
class Layout:
    """One way to train: where the model state lives."""

    name: str
    strategy: str  # what train_entry runs: ddp | fsdp | deepspeed
    zero_stage: int | None
    offload: str  # none | optimizer | optimizer+params | nvme
    about: str


# The table's rows, in the order the decision tree reads them.
LAYOUTS: tuple[Layout, ...] = (
    Layout("ddp", "ddp", None, "none", "full replica on every GPU"),
    Layout("zero1", "deepspeed", 1, "none", "optimizer state sharded"),
    Layout("zero2", "deepspeed", 2, "none", "optimizer state and gradients sharded"),
    Layout(
        "zero2_offload",
        "deepspeed",
        2,
        "optimizer",
        "ZeRO-2, optimizer and fp32 grads in host memory",
    ),
    Layout(
        "fsdp", "fsdp", None, "none", "FSDP2 fully_shard: parameters, gradients, optimizer sharded"
    ),
    Layout("zero3", "deepspeed", 3, "none", "everything sharded (DeepSpeed)"),
    Layout(
        "zero3_offload",
        "deepspeed",
        3,
        "optimizer",
        "ZeRO-3, optimizer and fp32 grads in host memory",
    ),
    Layout(
        "fsdp_offload",
        "fsdp",
        None,
        "optimizer+params",
        "FSDP2 CPUOffloadPolicy: all state in host memory",
    ),
    Layout(
        "zero3_offload_params",
        "deepspeed",
        3,
        "optimizer+params",
        "ZeRO-3, all state in host memory",
    ),
    Layout("zero3_nvme", "deepspeed", 3, "nvme", "ZeRO-3, optimizer and parameters on NVMe"),
)
BY_NAME = {lay.name: lay for lay in LAYOUTS}
# What each rank holds only its 1/N share of, by ZeRO stage (measured: DeepSpeed already reduces
# the gradients into their owner's partition at stage 1).
ZERO_SHARDED = {1: (GRADS, OPTIMIZER), 2: (GRADS, OPTIMIZER), 3: (PARAMS, GRADS, OPTIMIZER)}
# The out-of-memory ladder's strategy rungs (after batch -> mixed precision -> checkpointing).
# ZeRO-2 is not one: FSDP (core) fits wherever it does, and DeepSpeed is an optional install.
LADDER = ("ddp", "fsdp", "zero3_offload", "zero3_offload_params", "zero3_nvme")


@frozen(kw_only=True)
class Workload:
    """What is trained and on what: everything the memory model needs."""

    params: int
    precision: str = "bf16"
    optimizer: str = "adamw"
    nodes: int = 1
    gpus: int = 1  # per node
    gpu_mem_bytes: int = 80 * GIB
    micro_batch: int | None = None
    seq_len: int | None = None
    hidden: int | None = None
    layers: int | None = None
    host_mem_bytes: int | None = None  # per node; None: not checked
    largest_param: int | None = None  # elements of the biggest parameter tensor (from --model)
    heads: int | None = None
    global_batch: int | None = None  # sequences per optimizer step; None: world x micro_batch
    schedule: str = "1f1b"  # pipeline schedule: gpipe | 1f1b | interleaved_1f1b
    domain: int | None = None  # GPUs joined by the fast link (NVLink); None: gpus per node
    assumed: tuple[str, ...] = ()  # shape fields the plan assumed (hpctrain.plan.parallel)
    # the pick's network term (hpctrain/plan/network.py); None: its stated default
    inter_gbps: float | None = None  # bus bandwidth between nodes, GB/s
    intra_gbps: float | None = None  # inside a node (NVLink)
    tflops: float | None = None  # effective TFLOP/s per GPU

    @property
    def world(self) -> int:
        return self.nodes * self.gpus

    @property
    def has_activations(self) -> bool:
        return None not in (self.micro_batch, self.seq_len, self.hidden, self.layers)

    @property
    def usable_bytes(self) -> int:
        return int(self.gpu_mem_bytes * (1 - HEADROOM)) - CUDA_CONTEXT_BYTES


@mutable(kw_only=True)
class Estimate:
    """Bytes one rank holds under one layout (GPU side unless named host)."""

    name: str
    strategy: str
    zero_stage: int | None
    offload: str
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    transient_bytes: int  # gathered parameters of the units in flight (sharded layouts)
    activation_bytes_per_gpu: int | None
    activation_bytes_per_gpu_checkpointed: int | None
    host_bytes_per_node: int
    fits: bool
    fits_with_checkpointing: bool

    @property
    def model_state_bytes_per_gpu(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["model_state_bytes_per_gpu"] = self.model_state_bytes_per_gpu
        return d


def model_state(
    layout: Layout,
    *,
    params: int,
    world: int,
    precision: str,
    optimizer: str,
    largest: int | None = None,
) -> tuple[int, int, int, int]:
    """(params, grads, optimizer, host) bytes per rank; host = what offload moves to host memory.
    `largest`: the biggest single parameter tensor's element count (ZeRO-1/2 offload stages each
    gradient through one fp32 buffer of that size on each side); default P/24."""
    if precision not in PRECISIONS:
        raise UserError(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if optimizer not in OPT_BYTES:
        raise UserError(f"optimizer {optimizer!r}: choose one of {', '.join(OPTIMIZERS)}")
    P, N, k = params, world, OPT_BYTES[optimizer]
    w = 4 if precision == "fp32" else 2
    split = sharded(layout)

    def shard(nbytes_per_param: int) -> int:
        return math.ceil(P * nbytes_per_param / N)

    def held(part: str, nbytes_per_param: int) -> int:
        return shard(nbytes_per_param) if part in split else nbytes_per_param * P

    if not strategies.info(layout.strategy).master_copy:
        # fp32 parameters and gradients: offload moves all of it to the host
        p, g, o = held(PARAMS, 4), held(GRADS, 4), held(OPTIMIZER, k)
        return (0, 0, 0, p + g + o) if layout.offload != "none" else (p, g, o, 0)
    # the training dtype, and an fp32 master copy in the optimizer state (DeepSpeed ZeRO)
    p, g, o = held(PARAMS, w), held(GRADS, w), held(OPTIMIZER, k + 4)
    if layout.offload == "none":
        return p, g, o, 0
    # Host: fp32 master + optimizer states, the fp32 gradient partition, and a low-precision
    # partition (ZeRO-1/2: the copy sent back after the step; ZeRO-3: the gradient partition).
    host_opt = o + shard(4) + shard(w)
    if layout.offload == "optimizer" and layout.zero_stage in (1, 2):
        # + one fp32 staging buffer per side for the largest parameter's gradient
        stage = 4 * (largest or math.ceil(P / DEFAULT_UNITS))
        return p, stage, 0, host_opt + stage
    if layout.offload == "optimizer":
        return p, 0, 0, host_opt
    if layout.offload == "optimizer+params":
        return 0, 0, 0, host_opt + p
    return 0, 0, 0, 0  # nvme: staging buffers only


def sharded(layout: Layout) -> tuple[str, ...]:
    """The model state each rank holds only its 1/N share of under `layout`."""
    info = strategies.info(layout.strategy)
    if info.zero and layout.zero_stage is not None:
        return ZERO_SHARDED[layout.zero_stage]
    return info.sharded


def activation_bytes(
    wl: Workload, *, precision: str, micro_batch: int, checkpointed: bool
) -> int | None:
    """Activations of one micro-batch on one GPU (transformer layers, flash attention)."""
    if not wl.has_activations:
        return None
    a = 4 if precision == "fp32" else 2
    sbh = micro_batch * wl.seq_len * wl.hidden  # type: ignore[operator]
    per_layer = ACT_ELEMS_PER_LAYER * sbh * a
    if checkpointed:
        # each layer's input is kept; one layer is recomputed at a time during backward
        return wl.layers * sbh * a + per_layer  # type: ignore[operator]
    return wl.layers * per_layer  # type: ignore[operator]


def _transient(layout: Layout, wl: Workload, precision: str) -> int:
    """Sharded layouts gather one wrapped unit (a layer) at a time and prefetch the next."""
    if PARAMS not in sharded(layout):  # whole parameters are never gathered
        return 0
    w = 4 if precision == "fp32" else 2
    unit = wl.params / (wl.layers or DEFAULT_UNITS)
    return int(2 * unit * w)


def estimate(
    layout: Layout, wl: Workload, *, precision: str | None = None, micro_batch: int | None = None
) -> Estimate:
    precision = precision or wl.precision
    mb = micro_batch or wl.micro_batch or 1
    p, g, o, host = model_state(
        layout,
        params=wl.params,
        world=wl.world,
        precision=precision,
        optimizer=wl.optimizer,
        largest=wl.largest_param,
    )
    tr = _transient(layout, wl, precision)
    act = activation_bytes(wl, precision=precision, micro_batch=mb, checkpointed=False)
    act_ck = activation_bytes(wl, precision=precision, micro_batch=mb, checkpointed=True)
    host_ok = wl.host_mem_bytes is None or host * wl.gpus <= wl.host_mem_bytes * (1 - HEADROOM)
    base = p + g + o + tr
    return Estimate(
        name=layout.name,
        strategy=layout.strategy,
        zero_stage=layout.zero_stage,
        offload=layout.offload,
        params_bytes=p,
        grads_bytes=g,
        optimizer_bytes=o,
        transient_bytes=tr,
        activation_bytes_per_gpu=act,
        activation_bytes_per_gpu_checkpointed=act_ck,
        host_bytes_per_node=host * wl.gpus,
        fits=host_ok and base + (act or 0) <= wl.usable_bytes,
        fits_with_checkpointing=host_ok and base + (act_ck or 0) <= wl.usable_bytes,
    )
