"""Model parallelism in the plan: tensor (TP) and pipeline (PP) parallel and their products with
FSDP over the rest (DP), per GPU: memory, communication and the pipeline bubble.

Pure arithmetic (docs/plan-and-doctor.md, "Tensor and pipeline parallel", derives each term):
- activations per layer: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models"), with and without sequence parallel and selective recomputation;
- activations in flight on the first pipeline stage per schedule (GPipe m, 1F1B min(m, p),
  interleaved 1F1B min(m, p)(1 + (p-1)/(p v)));
- the bubble, (p-1)/(m+p-1) of the step for GPipe and 1F1B, (p-1)/(v m+p-1) interleaved;
- bytes each GPU sends per step over each dimension's collectives, and which of them cross nodes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from hpctrain.plan.model import BY_NAME, Workload, model_state

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
VIRTUAL_STAGES = 2  # interleaved 1F1B: model chunks per pipeline rank
DEFAULT_SEQ_LEN = 4096
ASPECT = 128  # hidden / layers of the published dense transformers (GPT-3 175B, Llama 3 8B/405B)


def assume_shape(wl: Workload) -> Workload:
    """The workload with every missing shape field filled in and named in `assumed`.

    From P alone: P ~ 12 L h^2 with h = 128 L gives h = (128 P / 12)^(1/3); layers are rounded to
    a multiple of 8 (so pipeline stages can divide them), the width to 1024 above 4096 (else 64),
    heads = width / 128 (else 64). 405e9 gives 128 x 16384 x 128 heads (Llama 3 405B: 126 x 16384
    x 128), 7e9 gives 32 x 4096 x 32 (Llama 2 7B's shape). Sequence 4096, micro-batch 1."""
    assumed = []
    raw_h = (ASPECT * wl.params / 12) ** (1 / 3)
    layers = wl.layers
    if layers is None:
        raw_l = raw_h / ASPECT
        layers = max(2, round(raw_l / 8) * 8 if raw_l >= 8 else round(raw_l))
        assumed.append("layers")
    hidden = wl.hidden
    if hidden is None:
        raw = math.sqrt(wl.params / (12 * layers))
        step = 1024 if raw >= 4096 else 64
        hidden = max(64, round(raw / step) * step)
        assumed.append("hidden")
    heads = wl.heads
    if heads is None:
        heads = max(1, hidden // 128 if hidden % 128 == 0 else hidden // 64)
        assumed.append("heads")
    seq = wl.seq_len
    if seq is None:
        seq = DEFAULT_SEQ_LEN
        assumed.append("seq_len")
    mb = wl.micro_batch
    if mb is None:
        mb = 1
        assumed.append("micro_batch")
    return dataclasses.replace(
        wl,
        layers=layers,
        hidden=hidden,
        heads=heads,
        seq_len=seq,
        micro_batch=mb,
        assumed=tuple(wl.assumed) + tuple(assumed),
    )


def act_per_layer(
    *, s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False, recompute: str = "selective"
) -> float:
    """Bytes of 16-bit activations one transformer layer stores for backward, per GPU
    (Korthikanti et al. 2022, Table 2; s sequence, b micro-batch, h hidden, a heads, t TP size):

    | recompute | no SP | SP |
    | none      | sbh(10 + 24/t + 5as/(ht)) | sbh(34 + 5as/h)/t |
    | selective | sbh(10 + 24/t)            | 34 sbh/t |
    | full      | 2 sbh                      | 2 sbh/t |

    "selective" drops the attention scores (5as/h), which is also what fused (flash) attention
    stores; at t = 1 both columns are sbh(34 + 5as/h)."""
    sbh = s * b * h
    scores = 0.0 if recompute == "selective" else 5 * a * s / h
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    if sp:
        return sbh * (34 + scores) / t
    return sbh * (10 + 24 / t + scores / t)


def in_flight(schedule: str, p: int, m: int, v: int = VIRTUAL_STAGES) -> float:
    """Micro-batches whose activations the first stage holds at its peak, in units of one stage's
    layers: GPipe runs every forward first (m); 1F1B starts a backward after p forwards
    (min(m, p)); interleaved 1F1B keeps p plus (p-1)/v chunk-sized extras (Korthikanti et al.,
    section 4.2.3: L (1 + (p-1)/(p v)) layers in total)."""
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(m, p))
    return min(m, p) * (1 + (p - 1) / (p * v))


def bubble(schedule: str, p: int, m: int, v: int = VIRTUAL_STAGES) -> float:
    """Idle share of a pipeline step: (p-1)/(m+p-1) for GPipe and 1F1B (p-1 warm-up and drain
    slots beside m busy ones), (p-1)/(v m+p-1) interleaved (each slot is 1/v as long)."""
    if p <= 1:
        return 0.0
    slots = v * m if schedule == "interleaved_1f1b" else m
    return (p - 1) / (slots + p - 1)


def ring(n: int) -> float:
    """Share of a buffer each rank sends in a ring all-gather or reduce-scatter of n ranks."""
    return (n - 1) / n


def tp_bytes_per_layer(*, s: int, b: int, h: int, t: int, w: int, recompute: str) -> float:
    """Bytes one GPU sends per layer per micro-batch for TP: two all-reduces forward (attention
    and MLP outputs; with sequence parallel each is an all-gather + reduce-scatter, the same
    volume) and two backward, each 2 (t-1)/t of s b h elements; full recompute repeats the forward
    two."""
    n = 6 if recompute == "full" else 4
    return n * 2 * ring(t) * s * b * h * w if t > 1 else 0.0


@dataclass(kw_only=True)
class Candidate:
    """One tp x pp x dp layout (DP shards with FSDP2) at one rung of the ladder."""

    name: str
    tp: int
    pp: int
    dp: int
    schedule: str
    microbatches: int  # per pipeline per optimizer step (grad accumulation when pp = 1)
    bubble: float
    layers_per_stage: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    transient_bytes: int  # FSDP-gathered parameters
    activation_bytes: int
    activation_checkpointing: bool
    precision: str
    total_bytes_per_gpu: int
    fits: bool
    tp_bytes_per_step: int  # sent per GPU, inside the fast domain
    pp_bytes_per_step: int
    dp_bytes_per_step: int
    slow_bytes_per_step: int  # of the above, what crosses nodes
    crosses_nodes: tuple[str, ...]
    step_s: float = 0.0  # the estimated step (hpctrain/plan/network.py), set by choose()

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def layouts(wl: Workload) -> list[tuple[int, int, int]]:
    """Every (tp, pp, dp) with tp > 1 or pp > 1: tp divides the fast domain, the heads and the
    width; pp divides the layers; tp x pp divides the world."""
    domain = wl.domain or wl.gpus
    out = []
    for tp in range(1, domain + 1):
        if domain % tp or wl.gpus % tp or wl.heads % tp or wl.hidden % tp:  # type: ignore[operator]
            continue
        for pp in range(1, wl.layers + 1):  # type: ignore[operator]
            if wl.layers % pp or wl.world % (tp * pp) or (tp, pp) == (1, 1):  # type: ignore[operator]
                continue
            out.append((tp, pp, wl.world // (tp * pp)))
    return out


def candidate(
    wl: Workload, tp: int, pp: int, dp: int, *, precision: str, checkpointing: bool
) -> Candidate | None:
    """Memory and communication of one layout; None when the batch does not split into it."""
    s, b, h, a, L = wl.seq_len, wl.micro_batch, wl.hidden, wl.heads, wl.layers
    assert s and b and h and a and L, "assume_shape() first"
    batch = wl.global_batch or wl.world * b
    if batch % (dp * b):
        return None
    m = batch // (dp * b)
    schedule = wl.schedule if pp > 1 else "none"
    if schedule == "interleaved_1f1b" and (m < pp or L % (pp * VIRTUAL_STAGES)):
        return None
    w = 4 if precision == "fp32" else 2
    shard = math.ceil(wl.params / (tp * pp))  # TP splits every matrix, PP the layers
    p_b, g_b, o_b, _ = model_state(
        BY_NAME["fsdp"], params=shard, world=dp, precision=precision, optimizer=wl.optimizer
    )
    if dp == 1:
        gathered = 0
    elif pp > 1:  # under PP the stage stays gathered for the step (torchtitan's default)
        gathered = shard * w
    else:  # one wrapped layer gathered and the next prefetched
        gathered = 2 * math.ceil(shard / L) * w
    per_stage = L // pp
    sp = tp > 1  # sequence parallel for the norms whenever TP is on
    flight = in_flight(schedule, pp, m) if pp > 1 else 1.0
    scale = w / 2  # the formulas count 16-bit activations
    if checkpointing:  # each layer keeps its input; one layer at a time is recomputed
        kept = act_per_layer(s=s, b=b, h=h, a=a, t=tp, sp=sp, recompute="full")
        act = (flight * per_stage * kept + act_per_layer(s=s, b=b, h=h, a=a, t=tp, sp=sp)) * scale
    else:
        act = flight * per_stage * act_per_layer(s=s, b=b, h=h, a=a, t=tp, sp=sp) * scale
    total = p_b + g_b + o_b + gathered + int(act)
    recompute = "full" if checkpointing else "selective"
    tp_bytes = m * per_stage * tp_bytes_per_layer(s=s, b=b, h=h, t=tp, w=w, recompute=recompute)
    # PP: one activation forward and one gradient backward per micro-batch, sequence-sharded by SP
    pp_bytes = 2 * m * s * b * h * w / tp if pp > 1 else 0.0
    # FSDP over dp: all-gather forward and backward (once per step under PP, else per
    # micro-batch), reduce-scatter of fp32 gradients once per step
    gathers = 2 if pp > 1 else 2 * m
    dp_bytes = ring(dp) * shard * (gathers * w + 4) if dp > 1 else 0.0
    crosses = []
    if tp * dp > wl.gpus and dp > 1:
        crosses.append("dp")
    if pp > 1 and wl.world > wl.gpus:
        crosses.append("pp")
    slow = (pp_bytes if "pp" in crosses else 0) + (dp_bytes if "dp" in crosses else 0)
    return Candidate(
        name=f"tp{tp}_pp{pp}_dp{dp}",
        tp=tp,
        pp=pp,
        dp=dp,
        schedule=schedule,
        microbatches=m,
        bubble=round(bubble(schedule, pp, m), 6),
        layers_per_stage=per_stage,
        params_bytes=p_b,
        grads_bytes=g_b,
        optimizer_bytes=o_b,
        transient_bytes=gathered,
        activation_bytes=int(act),
        activation_checkpointing=checkpointing,
        precision=precision,
        total_bytes_per_gpu=total,
        fits=total <= wl.usable_bytes,
        tp_bytes_per_step=int(tp_bytes),
        pp_bytes_per_step=int(pp_bytes),
        dp_bytes_per_step=int(dp_bytes),
        slow_bytes_per_step=int(slow),
        crosses_nodes=tuple(crosses),
    )


def best_rung(wl: Workload, tp: int, pp: int, dp: int) -> Candidate | None:
    """The layout at the ladder's first rung that fits (as asked, bf16 if fp32 was asked, then
    activation checkpointing), else its last rung; None if the batch does not split."""
    rungs = [(wl.precision, False)]
    if wl.precision == "fp32":
        rungs.append(("bf16", False))
    rungs.append((rungs[-1][0], True))
    last = None
    for prec, ck in rungs:
        last = candidate(wl, tp, pp, dp, precision=prec, checkpointing=ck)
        if last is None or last.fits:
            return last
    return last


def rank_key(c: Candidate) -> tuple[float, ...]:
    """The choice among layouts that fit: the shortest estimated step (its network term weighs
    the bytes between nodes), then the least traffic between nodes, then the least model
    parallelism (tp x pp), then the least memory."""
    return (round(c.step_s, 6), c.slow_bytes_per_step, c.tp * c.pp, c.total_bytes_per_gpu)


def choose(
    wl: Workload, step: Callable[[Candidate], float]
) -> tuple[Candidate | None, list[Candidate]]:
    """(the chosen layout or None, every layout at its best rung, best first); `step` estimates
    a layout's step time in seconds."""
    found = [c for t, p, d in layouts(wl) if (c := best_rung(wl, t, p, d)) is not None]
    for c in found:
        c.step_s = step(c)
    found.sort(key=lambda c: (not c.fits, *rank_key(c)))
    return (found[0] if found and found[0].fits else None), found
