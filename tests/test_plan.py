"""hpctrain plan: the memory model's arithmetic, the decision tree and the ladder, the CLI and its JSON.
(The model-state figures are checked against real strategies in test_plan_memory.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from hpctrain.cli import main
from hpctrain.plan import (
    BY_NAME,
    CUDA_CONTEXT_BYTES,
    GIB,
    HEADROOM,
    Workload,
    make_plan,
    model_state,
    recommend,
)

P = 1_000_000


def plan_json(*args: str) -> tuple[int, dict]:
    res = CliRunner().invoke(main, ["plan", *args, "--json"])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.output)


@pytest.mark.parametrize(
    "name,precision,optimizer,expected",
    [
        # (params, grads, optimizer, host) per rank for P params over 4 ranks
        ("ddp", "bf16", "adamw", (4 * P, 4 * P, 8 * P, 0)),
        ("ddp", "fp32", "sgd", (4 * P, 4 * P, 0, 0)),
        ("ddp", "fp32", "sgd-momentum", (4 * P, 4 * P, 4 * P, 0)),
        ("fsdp", "bf16", "adamw", (P, P, 2 * P, 0)),
        ("fsdp_offload", "bf16", "adamw", (0, 0, 0, 4 * P)),
        ("zero1", "bf16", "adamw", (2 * P, P // 2, 3 * P, 0)),
        ("zero2", "fp32", "adamw", (4 * P, P, 3 * P, 0)),
        ("zero3", "bf16", "adamw", (P // 2, P // 2, 3 * P, 0)),
        ("zero3_offload", "bf16", "adamw", (P // 2, 0, 0, 3 * P + P + P // 2)),
        ("zero3_offload_params", "bf16", "adamw", (0, 0, 0, 3 * P + P + P // 2 + P // 2)),
        ("zero3_nvme", "bf16", "adamw", (0, 0, 0, 0)),
    ],
)
def test_model_state_formulas(name, precision, optimizer, expected):
    assert (
        model_state(BY_NAME[name], params=P, world=4, precision=precision, optimizer=optimizer)
        == expected
    )


def test_small_model_gets_ddp_with_the_reason():
    rec = recommend(params=125_000_000, nodes=2, gpus=8, gpu_mem_gib=80)
    assert (rec.strategy, rec.zero_stage, rec.offload) == ("ddp", None, "none")
    assert "fits on one GPU" in rec.reason and "DDP" in rec.reason
    assert json.loads(rec.to_json())["strategy"] == "ddp"


def test_decision_tree_moves_to_sharding_then_offload_as_the_model_grows():
    # 16 B/param: 7B needs 104 GiB for DDP; sharded over 16 GPUs it fits on 80 GiB GPUs: FSDP
    # (core), not ZeRO-2 (DeepSpeed, an optional install), though ZeRO-2 fits too.
    assert recommend(params=7_000_000_000, nodes=2, gpus=8, gpu_mem_gib=80).name == "fsdp"
    # 8 GPUs of 24 GiB: ZeRO-2 keeps a 13 GiB bf16 replica plus shards (> 20 GiB usable); FSDP fits.
    assert recommend(params=7_000_000_000, nodes=1, gpus=8, gpu_mem_gib=24).name == "fsdp"
    rec = recommend(params=20_000_000_000, nodes=1, gpus=4, gpu_mem_gib=24)
    assert rec.offload in ("optimizer", "optimizer+params") and rec.zero_stage == 3
    assert "offload" in rec.reason


def test_nothing_fits_is_a_user_error_and_plan_exits_1():
    from hpctrain.kernel.errors import UserError

    with pytest.raises(UserError, match="pipeline/tensor"):
        recommend(params=400_000_000_000, gpus=1, gpu_mem_gib=8, layers=1)
    code, out = plan_json(
        "--params",
        "400000000000",
        "--gpus",
        "1",
        "--gpu-mem-gib",
        "8",
        "--layers",
        "1",
        "--micro-batch",
        "1",
        "--seq-len",
        "1",
        "--hidden",
        "1",
    )
    assert code == 1 and out["recommended"] is None


def test_ladder_order_batch_then_precision_then_checkpointing():
    # DDP's model state (16 B/param) fits; activations at micro-batch 8 do not.
    wl = Workload(
        params=100_000_000,
        precision="fp32",
        nodes=1,
        gpus=2,
        gpu_mem_bytes=24 * GIB,
        micro_batch=8,
        seq_len=4096,
        hidden=8192,
        layers=24,
    )
    plan = make_plan(wl)
    rungs = [(s["name"], s["rung"]) for s in plan.ladder]
    assert rungs[0] == ("ddp", "as asked")
    labels = [r for _, r in rungs]
    assert (
        labels.index("micro-batch 4")
        < labels.index("micro-batch 1, bf16 mixed precision")
        < labels.index("micro-batch 1, bf16, activation checkpointing")
    )
    rec = plan.recommendation
    assert rec is not None and rec.name == "ddp"
    assert (rec.micro_batch, rec.precision, rec.activation_checkpointing) == (1, "bf16", True)
    assert rec.grad_accumulation == 8 and "accumulation x8" in rec.reason
    # every rung before the chosen one did not fit, and the chosen one did
    assert [s["fits"] for s in plan.ladder] == [False] * (len(plan.ladder) - 1) + [True]


def test_headroom_and_context_are_taken_off_the_gpu():
    wl = Workload(params=1, gpu_mem_bytes=40 * GIB)
    assert wl.usable_bytes == int(40 * GIB * (1 - HEADROOM)) - CUDA_CONTEXT_BYTES


def test_json_has_every_strategy_and_the_recommendation():
    code, out = plan_json(
        "--params",
        "1300000000",
        "--nodes",
        "1",
        "--gpus",
        "8",
        "--gpu-mem-gib",
        "40",
        "--micro-batch",
        "4",
        "--seq-len",
        "2048",
        "--hidden",
        "2048",
        "--layers",
        "24",
    )
    assert code == 0
    names = [s["name"] for s in out["strategies"]]
    assert {
        "ddp",
        "zero1",
        "zero2",
        "fsdp",
        "zero3",
        "zero2_offload",
        "zero3_offload",
        "zero3_offload_params",
        "fsdp_offload",
        "zero3_nvme",
    } <= set(names)
    for s in out["strategies"]:
        assert (
            s["model_state_bytes_per_gpu"]
            == s["params_bytes"] + s["grads_bytes"] + s["optimizer_bytes"]
        )
        assert s["activation_bytes_per_gpu"] > s["activation_bytes_per_gpu_checkpointed"] > 0
        assert isinstance(s["fits"], bool)
    assert out["recommended"] in names
    assert out["recommendation"]["strategy"] in ("ddp", "fsdp", "deepspeed")
    ddp = next(s for s in out["strategies"] if s["name"] == "ddp")
    assert ddp["model_state_bytes_per_gpu"] == 16 * 1_300_000_000


def test_table_output_marks_the_choice():
    res = CliRunner().invoke(
        main, ["plan", "--params", "125000000", "--gpus", "2", "--gpu-mem-gib", "24"]
    )
    assert res.exit_code == 0, res.output
    assert "ddp *" in res.output and "recommended: ddp" in res.output and "why:" in res.output
    assert "assumed from the parameter count: give --layers" in res.output


def test_model_factory_counted_on_meta_device(tmp_path, monkeypatch):
    (tmp_path / "mymodels_h6.py").write_text(
        textwrap.dedent("""
        import torch
        import torch.nn as nn
        def big():
            assert torch.empty(1).device.type == "meta"  # built without memory
            m = nn.Sequential(nn.Embedding(1000, 64), nn.Linear(64, 1000, bias=False))
            m[1].weight = m[0].weight  # tied: counted once
            return m
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out = plan_json("--model", "mymodels_h6:big", "--gpu-mem-gib", "8")
    assert code == 0
    assert out["inputs"]["params"] == 64_000 and out["inputs"]["largest_param"] == 64_000


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "exactly one of --params"),
        (["--params", "10", "--model", "a:b"], "exactly one of --params"),
        (["--params", "10"], "GPU memory unknown"),
        (["--model", "no_such_module_xyz:f", "--gpu-mem-gib", "8"], "cannot import"),
        (["--model", "nocolon", "--gpu-mem-gib", "8"], "pkg.module:factory"),
        (["--params", "10", "--gpu-mem-gib", "0.5"], "leaves nothing"),
    ],
)
def test_bad_input_exits_2_with_a_message(args, message):
    res = CliRunner().invoke(main, ["plan", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_gpu_memory_from_the_profile(tmp_path, monkeypatch):
    prof = tmp_path / "site.yaml"
    prof.write_text("name: site\nscheduler: slurm\nslurm:\n  gpus_per_node: 4\n  gpu_mem_gib: 24\n")
    os.chmod(prof, 0o644)
    os.chmod(tmp_path, 0o755)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    code, out = plan_json("--params", "1000000", "--profile", str(prof), "--gpus", "4")
    assert code == 0 and out["inputs"]["gpu_mem_bytes"] == 24 * GIB


def test_plan_without_model_does_not_import_torch():
    code = (
        "import sys; from click.testing import CliRunner; from hpctrain.cli import main; "
        "r = CliRunner().invoke(main, ['plan', '--params', '1000', '--gpu-mem-gib', '8']); "
        "assert r.exit_code == 0, r.output; "
        "assert 'torch' not in sys.modules and 'deepspeed' not in sys.modules"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    "text, expected",
    [
        ("7000000000", 7_000_000_000),
        ("7e9", 7_000_000_000),
        ("1.3e9", 1_300_000_000),
        ("7B", 7_000_000_000),
        ("350M", 350_000_000),
        ("125k", 125_000),
    ],
)
def test_params_accepts_the_ways_people_write_counts(text, expected):
    assert plan_json("--params", text, "--gpu-mem-gib", "80")[1]["inputs"]["params"] == expected


@pytest.mark.parametrize("text", ["abc", "0", "-5", "7X"])
def test_params_rejects_what_is_not_a_count(text):
    res = CliRunner().invoke(main, ["plan", "--params", text, "--gpu-mem-gib", "80"])
    assert res.exit_code == 2
    assert "not a parameter count" in res.output
