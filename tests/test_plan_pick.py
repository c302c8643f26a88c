"""The plan's pick weighs the bytes each GPU sends between nodes (issue 34): every candidate shows
them, data-parallel ones included; tensor parallel stays inside the node for 405B and 70B; FSDP
(core) before ZeRO-2 (DeepSpeed, optional); the snapshot line warns without the node's memory."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpctrain.cli import main
from hpctrain.plan import BY_NAME, GIB, Workload, make_plan, recommend
from hpctrain.plan.network import dp_bytes, network
from hpctrain.plan.parallel import ring


def plan_json(*args: str) -> dict[str, object]:
    res = CliRunner().invoke(main, ["plan", *args, "--json"])
    assert res.exit_code in (0, 1), res.output
    return json.loads(res.output)  # type: ignore[no-any-return]


def test_every_strategy_shows_its_bytes_between_nodes_by_the_docs_formula():
    out = plan_json("--params", "405e9", "--nodes", "32", "--gpus", "8", "--gpu-mem-gib", "80")
    rows = {s["name"]: s for s in out["strategies"]}  # type: ignore[attr-defined]
    P, N = 405e9, 256
    # docs/plan-and-doctor.md: FSDP gathers twice per micro-batch (w = 2) and reduce-scatters fp32
    assert rows["fsdp"]["between_nodes_bytes_per_step"] == int(ring(N) * P * (2 * 2 + 4))
    assert rows["fsdp"]["between_nodes_bytes_per_step"] / GIB == pytest.approx(3005.7, abs=0.1)
    assert rows["ddp"]["between_nodes_bytes_per_step"] == int(2 * ring(N) * P * 4)
    assert rows["zero2"]["between_nodes_bytes_per_step"] == int(ring(N) * P * 4)
    for row in out["parallel"]:  # type: ignore[attr-defined]
        assert row["slow_bytes_per_step"] >= 0 and row["step_s"] > 0
    # one node: nothing crosses
    one = plan_json("--params", "7e9", "--gpus", "8", "--gpu-mem-gib", "80")
    assert all(s["between_nodes_bytes_per_step"] == 0 for s in one["strategies"])  # type: ignore[attr-defined]
    res = CliRunner().invoke(
        main, ["plan", "--params", "7e9", "--nodes", "4", "--gpus", "8", "--gpu-mem-gib", "80"]
    )
    header = next(line for line in res.output.splitlines() if line.startswith("strategy"))
    assert header.split()[-4:] == ["between", "fits", "ckpt", "fits"]  # the table's column


def test_405b_on_32_nodes_puts_tensor_parallel_inside_the_node_and_says_why():
    plan = make_plan(Workload(params=405_000_000_000, nodes=32, gpus=8, gpu_mem_bytes=80 * GIB))
    rec = plan.recommendation
    assert rec is not None and rec.offload == "none" and rec.strategy == "fsdp"
    # tensor parallel inside the node (8 GPUs), data parallel across the 32 nodes
    assert (rec.tp, rec.pp, rec.dp) == (8, 1, 32)
    # why it won over FSDP, which fits: FSDP's bytes between nodes and both estimated steps
    assert "fsdp fits" in rec.reason and "3005.70 GiB per GPU per step between nodes" in rec.reason
    assert "saves" in rec.reason and "s per step" in rec.reason and "assumed" in rec.reason
    assert rec.between_nodes_bytes is not None and rec.between_nodes_bytes < 3005 * GIB


def test_70b_on_8_nodes_puts_tensor_parallel_inside_the_node():
    rec = recommend(params=70_000_000_000, nodes=8, gpus=8, gpu_mem_gib=80)
    assert (rec.tp, rec.pp, rec.dp, rec.strategy) == (2, 1, 32, "fsdp")
    assert "fsdp fits" in rec.reason


def test_7b_on_4_nodes_prefers_fsdp_to_zero2_and_says_why_no_model_parallel():
    plan = make_plan(Workload(params=7_000_000_000, nodes=4, gpus=8, gpu_mem_bytes=80 * GIB))
    zero2 = next(e for e in plan.estimates if e.name == "zero2")
    assert zero2.fits  # ZeRO-2 fits too, but needs DeepSpeed (an optional install)
    rec = plan.recommendation
    assert rec is not None and (rec.name, rec.strategy, rec.tp, rec.pp) == ("fsdp", "fsdp", 1, 1)
    assert "optional install" in rec.reason
    assert "the best tensor x pipeline layout" in rec.reason and "not 10% below" in rec.reason
    fsdp = dp_bytes(BY_NAME["fsdp"], plan.workload, precision="bf16")
    assert rec.step_s is not None and rec.between_nodes_bytes == fsdp


def test_the_network_term_moves_the_pick():
    """A slow network between nodes makes the pipeline's few bytes win over FSDP's gathers."""
    fast = recommend(params=7_000_000_000, nodes=4, gpus=8, gpu_mem_gib=80, inter_gbps=400)
    slow = recommend(params=7_000_000_000, nodes=4, gpus=8, gpu_mem_gib=80, inter_gbps=10)
    assert fast.name == "fsdp"
    assert slow.tp > 1 and (slow.between_nodes_bytes or 0) < (fast.between_nodes_bytes or 0)
    # on one node nothing crosses: data parallel stays
    assert recommend(params=7_000_000_000, nodes=1, gpus=8, gpu_mem_gib=24, inter_gbps=1).tp == 1


def test_the_network_assumptions_are_stated_and_replaced_by_flags():
    net = network(Workload(params=1))
    assert set(net.assumed) == {"inter_gbps", "intra_gbps", "tflops"}
    given = network(Workload(params=1, inter_gbps=50, intra_gbps=400, tflops=600))
    assert (given.inter_gbps, given.intra_gbps, given.tflops, given.assumed) == (50, 400, 600, ())
    out = plan_json("--params", "7e9", "--nodes", "4", "--gpus", "8", "--gpu-mem-gib", "80")
    assert out["network"]["assumed"] == ["inter_gbps", "intra_gbps", "tflops"]  # type: ignore[index]
    res = CliRunner().invoke(main, ["plan", "--params", "7e9", "--inter-gbps", "inf"])
    assert res.exit_code == 2 and "--inter-gbps inf" in res.output


def test_snapshot_line_warns_without_the_nodes_memory():
    args = ["plan", "--params", "70e9", "--nodes", "8", "--gpus", "8", "--gpu-mem-gib", "80"]
    res = CliRunner().invoke(main, args)
    text = " ".join(res.output.split())
    assert "WARNING: likely too large" in text and "assumed 1280.00 GiB" in text
    assert "--snapshot.every_steps=0" in text
    snap = plan_json(*args[1:])["snapshots"]
    assert snap["status"] == "likely_too_large"  # type: ignore[index]
    assert snap["assumed_node_mem_bytes"] == 1280 * GIB  # type: ignore[index]
    # a node memory that holds them: no warning (the given memory replaces the assumption)
    roomy = plan_json(*args[1:], "--host-mem-gib", "4096")["snapshots"]
    assert roomy["status"] == "fits" and roomy["assumed_node_mem_bytes"] is None  # type: ignore[index]
    small = plan_json("--params", "1e6", "--nodes", "2", "--gpus", "4", "--gpu-mem-gib", "80")
    assert small["snapshots"]["status"] == "unknown_memory"  # type: ignore[index]
