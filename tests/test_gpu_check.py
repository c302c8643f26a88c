"""`make gpu-check` on a machine without an NVIDIA GPU: it checks its own plan, says why it cannot
run, writes its JSON with "gpu": false and exits 77, having started nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import gpu_check  # noqa: E402


def test_without_a_gpu_it_checks_its_plan_and_exits_77(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check.json"
    before = set((REPO / "benchmarks").glob("gpu-check-*"))
    env = dict(
        os.environ,
        PATH=os.pathsep.join(
            p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists()
        ),
    )
    p = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
    )
    assert p.returncode == 77, p.stdout + p.stderr
    assert "plan: ok" in p.stdout and "no NVIDIA GPU usable here" in p.stdout
    assert "nothing was run" in p.stdout
    report = json.loads(out.read_text())
    assert report["schema"] == 1 and report["gpu"] is False and report["reason"]
    assert report["steps"] == {} and report["plan_problems"] == []
    names = [s["name"] for s in report["plan"]]
    assert names == [
        "environment",
        "ddp",
        "fsdp_cpu_offload",
        "deepspeed_zero2",
        "deepspeed_zero3",
        "big_gpt",
        "tp_fsdp",
        "doctor_nccl",
        "preempt_resume",
    ]
    assert sum(s["budget_s"] for s in report["plan"]) <= 335
    assert set((REPO / "benchmarks").glob("gpu-check-*")) == before  # no work folder made


def test_the_plan_check_catches_a_bad_step() -> None:
    steps = gpu_check.plan(2)
    assert gpu_check.check_plan(steps, 2) == []
    steps[1].args = [*steps[1].args, "--train.global_batch=12"]  # 12 % (3 x 8)
    steps.append(gpu_check.Step("extra", 30, "too long", "ddp", ["--model.no_such_key=1"], 5))
    problems = gpu_check.check_plan(steps, 3)
    assert any("more than 335 s" in p for p in problems)
    assert any(p.startswith("ddp:") and "global_batch" in p for p in problems)
    assert any(p.startswith("extra:") and "no_such_key" in p for p in problems)


def test_tp_fsdp_runs_on_an_even_gpu_count_and_says_why_not_on_one() -> None:
    two = {s.name: s for s in gpu_check.plan(2)}["tp_fsdp"]
    assert two.strategy == "fsdp" and "--parallel.tp=2" in two.args
    assert gpu_check.check_plan(gpu_check.plan(8), 8) == []  # dp 4 x tp 2, sizes valid
    one = {s.name: s for s in gpu_check.plan(1)}["tp_fsdp"]
    assert one.strategy is None and "skipped" in one.what
    assert gpu_check.run_step(one, Path("."), 1) == {
        "ok": True,
        "skipped": "tensor parallel needs 2 GPUs; this machine has 1",
    }


def test_mfu_arithmetic() -> None:
    # 6 N T for N = 1e8 parameters and T = 8192 tokens, plus attention 12 L d s T
    flops = gpu_check.gpt_flops_per_step(100_000_000, 8192)
    assert flops == 6 * 1e8 * 8192 + 12 * 12 * 1024 * 1024 * 8192
