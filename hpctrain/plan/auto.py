"""recommend(): `hpctrain plan` as a function, for `submit --strategy auto` and scripts."""

from __future__ import annotations

from hpctrain.kernel.errors import UserError
from hpctrain.plan.inputs import workload
from hpctrain.plan.ladder import Recommendation, make_plan, no_fit_message


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
    inter_gbps: float | None = None,
    intra_gbps: float | None = None,
    tflops: float | None = None,
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
    NVLink, else the profile's `slurm.gpus_per_domain`, else `gpus`) bounds tensor parallel;
    `inter_gbps` (else the profile's `preflight.expected_busbw_gbps`), `intra_gbps` and `tflops`
    set the network term of the pick (hpctrain/plan/network.py; stated defaults).
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
            inter_gbps=inter_gbps,
            intra_gbps=intra_gbps,
            tflops=tflops,
        )
    )
    if plan.recommendation is None:
        raise UserError(no_fit_message(plan))
    return plan.recommendation
