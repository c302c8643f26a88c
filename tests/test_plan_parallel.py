"""hpctrain plan's tensor x pipeline x FSDP branch: each term against a hand-computed case
(Korthikanti et al. 2022's activation formula, the pipeline bubble, in-flight micro-batches per
schedule, communication volumes), the layout it recommends for 405B, and what it leaves alone."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpctrain.cli import main
from hpctrain.plan import GIB, Workload, make_plan, recommend
from hpctrain.plan.parallel import (
    act_per_layer,
    assume_shape,
    bubble,
    candidate,
    in_flight,
    layouts,
    tp_bytes_per_layer,
)

# GPT-3 175B's layer (Korthikanti et al. 2022, section 5): s 2048, h 12288, a 96 heads, t 8
GPT3 = {"s": 2048, "b": 1, "h": 12288, "a": 96}
SBH = 2048 * 12288  # 25,165,824; 5as/h = 5 * 96 * 2048 / 12288 = 80


@pytest.mark.parametrize(
    "t,sp,recompute,per_sbh",
    [
        (1, False, "none", 34 + 80),  # sbh(34 + 5as/h)
        (8, False, "none", 10 + 24 / 8 + 80 / 8),  # sbh(10 + 24/t + 5as/(ht)) = 23 sbh
        (8, True, "none", (34 + 80) / 8),  # sbh(34 + 5as/h)/t = 14.25 sbh
        (8, False, "selective", 10 + 24 / 8),  # 13 sbh
        (8, True, "selective", 34 / 8),  # 4.25 sbh: 5.4x less than TP alone, as the paper says
        (1, False, "selective", 34),  # fused attention at t = 1 (the DP ladder's 17 elements)
        (8, False, "full", 2),  # the layer's input only
        (8, True, "full", 2 / 8),
    ],
)
def test_activations_per_layer_follow_korthikanti(t, sp, recompute, per_sbh):
    got = act_per_layer(**GPT3, t=t, sp=sp, recompute=recompute)
    assert got == pytest.approx(per_sbh * SBH)


@pytest.mark.parametrize(
    "schedule,p,m,expected",
    [
        ("gpipe", 4, 8, 8),  # every forward before any backward
        ("1f1b", 4, 8, 4),  # p warm-up forwards
        ("1f1b", 4, 2, 2),  # fewer micro-batches than stages
        ("interleaved_1f1b", 4, 8, 4 * (1 + 3 / 8)),  # L(1 + (p-1)/(p v)), v = 2
    ],
)
def test_micro_batches_in_flight_per_schedule(schedule, p, m, expected):
    assert in_flight(schedule, p, m) == pytest.approx(expected)


@pytest.mark.parametrize(
    "schedule,p,m,expected",
    [
        ("gpipe", 4, 8, 3 / 11),  # (p-1)/(m+p-1)
        ("1f1b", 4, 8, 3 / 11),  # same idle time as GPipe, less memory
        ("1f1b", 16, 128, 15 / 143),
        ("interleaved_1f1b", 4, 8, 3 / 19),  # (p-1)/(v m + p-1), v = 2
        ("1f1b", 1, 8, 0.0),
    ],
)
def test_bubble_formula(schedule, p, m, expected):
    assert bubble(schedule, p, m) == pytest.approx(expected)


def test_tp_volume_per_layer():
    # 4 all-reduces (2 forward, 2 backward) x 2(t-1)/t x sbh x 2 bytes = 14 sbh at t = 8
    assert tp_bytes_per_layer(s=2048, b=1, h=12288, t=8, w=2, recompute="selective") == 14 * SBH
    # full recompute repeats the 2 forward ones: 21 sbh
    assert tp_bytes_per_layer(s=2048, b=1, h=12288, t=8, w=2, recompute="full") == 21 * SBH
    assert tp_bytes_per_layer(s=2048, b=1, h=12288, t=1, w=2, recompute="none") == 0


def small() -> Workload:
    return Workload(
        params=1_600_000_000,
        nodes=2,
        gpus=4,
        gpu_mem_bytes=80 * GIB,
        micro_batch=1,
        seq_len=1024,
        hidden=2048,
        layers=16,
        heads=16,
    )


def test_one_layout_by_hand():
    """tp 2 x pp 2 x dp 2 on 2 nodes x 4 GPUs, 1F1B, global batch 8 -> 4 micro-batches."""
    c = candidate(small(), 2, 2, 2, precision="bf16", checkpointing=False)
    assert c is not None
    shard = 400_000_000  # 1.6e9 / (tp 2 x pp 2)
    assert (c.params_bytes, c.grads_bytes, c.optimizer_bytes) == (
        4 * shard // 2,  # FSDP2's fp32 shards over dp 2
        4 * shard // 2,
        8 * shard // 2,
    )
    assert c.transient_bytes == 2 * shard  # the stage's bf16 parameters stay gathered under PP
    sbh = 1024 * 2048
    assert c.microbatches == 4 and c.layers_per_stage == 8
    # 1F1B holds min(m, p) = 2 micro-batches x 8 layers x 34 sbh / t (selective + SP)
    assert c.activation_bytes == 2 * 8 * 34 * sbh // 2
    assert c.total_bytes_per_gpu == 16 * shard // 2 + 2 * shard + 2 * 8 * 17 * sbh
    assert c.bubble == pytest.approx(1 / 5)
    assert c.tp_bytes_per_step == 4 * 8 * 4 * 2 * (1 / 2) * sbh * 2  # m x layers x per layer
    assert c.pp_bytes_per_step == 2 * 4 * sbh * 2 // 2  # act forward + grad backward, / t
    assert c.dp_bytes_per_step == shard // 2 * (2 * 2 + 4)  # 2 bf16 gathers + fp32 reduce-scatter
    # tp x dp = 4 ranks fit in a node; the pipeline's stages are on different nodes
    assert c.crosses_nodes == ("pp",) and c.slow_bytes_per_step == c.pp_bytes_per_step


def test_checkpointing_keeps_only_layer_inputs():
    c = candidate(small(), 2, 2, 2, precision="bf16", checkpointing=True)
    sbh = 1024 * 2048
    # 2 micro-batches x 8 layers x 2 sbh / t kept, plus one layer recomputed (34 sbh / t)
    assert c is not None and c.activation_bytes == 2 * 8 * 2 * sbh // 2 + 34 * sbh // 2


def test_gpipe_holds_every_micro_batch():
    wl = small()
    one = candidate(wl, 1, 2, 4, precision="bf16", checkpointing=False)
    gp = candidate(
        Workload(**{**wl.__dict__, "schedule": "gpipe"}),
        1,
        2,
        4,
        precision="bf16",
        checkpointing=False,
    )
    assert one is not None and gp is not None
    assert (one.microbatches, gp.activation_bytes / one.activation_bytes) == (2, 1.0)
    wl8 = Workload(**{**wl.__dict__, "schedule": "gpipe", "global_batch": 32})
    gp8 = candidate(wl8, 1, 2, 4, precision="bf16", checkpointing=False)
    assert gp8 is not None and gp8.microbatches == 8
    assert gp8.activation_bytes == 8 * 8 * 34 * 1024 * 2048  # m = 8 in flight, 8 layers each


def test_layouts_respect_the_domain_heads_and_layers():
    wl = Workload(**{**small().__dict__, "heads": 12, "layers": 12, "domain": 2})
    for tp, pp, dp in layouts(wl):
        assert 2 % tp == 0 and 12 % pp == 0 and tp * pp * dp == 8 and (tp, pp) != (1, 1)
    assert {tp for tp, _, _ in layouts(wl)} == {1, 2}


def test_shape_assumed_from_the_parameter_count():
    big = assume_shape(Workload(params=405_000_000_000))
    assert (big.layers, big.hidden, big.heads, big.seq_len, big.micro_batch) == (
        128,
        16384,
        128,
        4096,
        1,
    )
    assert set(big.assumed) == {"layers", "hidden", "heads", "seq_len", "micro_batch"}
    seven = assume_shape(Workload(params=7_000_000_000, layers=40))
    # sqrt(7e9 / (12 x 40)) = 3818.8, below 4096: rounded to a multiple of 64
    assert (seven.layers, seven.hidden, seven.heads) == (40, 3840, 30)
    assert "layers" not in seven.assumed


def test_405b_on_128_gpus_gets_tensor_x_pipeline_without_offload():
    # a slow network between nodes (25 GB/s): the pipeline's few bytes beat FSDP's gathers
    rec = recommend(
        params=405_000_000_000, precision="bf16", nodes=16, gpus=8, gpu_mem_gib=80, inter_gbps=25
    )
    assert rec.offload == "none" and rec.tp > 1 and rec.pp > 1
    assert rec.tp <= 8 and 8 % rec.tp == 0  # inside the node
    assert rec.tp * rec.pp * (rec.dp or 0) == 128
    assert rec.bubble == pytest.approx((rec.pp - 1) / (rec.microbatches + rec.pp - 1), abs=1e-6)
    assert rec.total_bytes_per_gpu <= 80 * GIB
    assert "zero3_offload would hold" in rec.offload_lost and "PCIe" in rec.offload_lost
    assert "even fully sharded" in rec.reason


def test_405b_cli_prints_the_layout_and_why_offload_lost():
    args = ["plan", "--params", "405e9", "--precision", "bf16", "--nodes", "16", "--gpus", "8"]
    args += ["--inter-gbps", "25"]
    res = CliRunner().invoke(main, [*args, "--gpu-mem-gib", "80"])
    assert res.exit_code == 0, res.output
    assert "recommended: tp" in res.output and "--parallel.tp" in res.output
    assert "bubble" in res.output and "offload lost:" in res.output
    assert "--parallel.microbatches 64 --train.micro_batch 64" in " ".join(res.output.split())
    assert "assumed from the parameter count" in res.output
    res = CliRunner().invoke(main, [*args, "--gpu-mem-gib", "80", "--json"])
    out = json.loads(res.output)
    lay = out["layout"]
    assert lay["tp"] * lay["pp"] * lay["dp"] == 128 and lay["schedule"] == "1f1b"
    assert out["recommendation"]["offload"] == "none"
    assert out["parallel"][0]["name"] == out["recommended"]


def test_7b_on_8_gpus_stays_data_parallel():
    for mem, name in ((80, "fsdp"), (24, "fsdp")):
        rec = recommend(params=7_000_000_000, nodes=1, gpus=8, gpu_mem_gib=mem)
        assert (rec.name, rec.tp, rec.pp, rec.dp) == (name, 1, 1, 8)


def test_a_smaller_domain_keeps_tp_inside_it():
    rec = recommend(params=405e9, nodes=16, gpus=8, gpu_mem_gib=80, domain=4)  # type: ignore[arg-type]
    assert rec.tp <= 4 and rec.offload == "none"


def test_the_estimated_step_decides_between_layouts_that_fit():
    """Among layouts that fit, the shortest estimated step wins (its network term: the bytes
    between nodes)."""
    plan = make_plan(
        Workload(params=405_000_000_000, nodes=16, gpus=8, gpu_mem_bytes=80 * GIB, precision="bf16")
    )
    fits = [c for c in plan.parallel if c.fits]
    assert fits[0].name == plan.recommendation.name  # type: ignore[union-attr]
    assert len(fits) > 3
    assert all(a.step_s <= b.step_s for a, b in zip(fits, fits[1:], strict=False))


@pytest.mark.parametrize("domain,most", [(None, 8), (4, 4)])
def test_strategy_auto_takes_the_mesh_and_the_profiles_domain(domain, most):
    """`submit --strategy auto` (the service's plan): a 405B model on 16 generic-ib nodes gets a
    tp x pp layout, with tp inside the profile's slurm.gpus_per_domain, and train_entry's flags."""
    from hpctrain.jobs.options import JobOptions
    from hpctrain.profiles import resolve
    from hpctrain.service.prepare import plan, plan_args

    # the profile's bandwidth between nodes (preflight.expected_busbw_gbps) is the plan's
    sets: dict[str, object] = {"preflight.expected_busbw_gbps": 25}
    if domain is not None:
        sets["slurm.gpus_per_domain"] = domain
    profile = resolve("generic-ib", sets)
    rec = plan(profile, JobOptions(params=405_000_000_000, nodes=16))
    assert rec.tp == most and rec.pp > 1 and rec.tp * rec.pp * rec.dp == 128
    assert plan_args(rec) == [
        f"--parallel.tp={rec.tp}",
        f"--parallel.pp={rec.pp}",
        "--parallel.schedule=1f1b",
        f"--parallel.microbatches={rec.microbatches}",
    ]
    assert rec.microbatches >= rec.pp


def test_profile_domain_must_divide_or_be_a_multiple_of_the_node():
    from hpctrain.kernel.errors import UserError
    from hpctrain.profiles import resolve

    assert resolve("generic-ib", {"slurm.gpus_per_domain": 72}).slurm.gpus_per_domain == 72
    with pytest.raises(UserError, match="gpus_per_domain 3 and gpus_per_node 8"):
        resolve("generic-ib", {"slurm.gpus_per_domain": 3})
