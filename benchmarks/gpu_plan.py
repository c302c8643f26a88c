"""`make gpu-check`'s plan: the steps, their time limits and flags, and the checks of the plan that
run on any machine (benchmarks/gpu_check.py runs it on a GPU machine)."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from hpctrain.kernel import jobenv

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
HPCTRAIN = str(Path(PY).with_name("hpctrain"))
SCHEMA = 1
TOTAL_BUDGET_S = 335
SKIPPED_EXIT = 77  # the automake / CTest convention for "skipped"
# job environment names (train_entry reads them; kept in one place here)
ENV_DEVICE = jobenv.DEVICE
ENV_STOP_AT_STEP = jobenv.STOP_AT_STEP

SMALL = [
    "--model.d_model=256",
    "--model.n_layers=4",
    "--model.n_heads=4",
    "--model.seq_len=128",
    "--train.micro_batch=8",
    "--train.log_every=1",
]
BIG = {
    "d_model": 1024,
    "n_layers": 12,
    "n_heads": 16,
    "seq_len": 1024,
    "vocab_size": 32768,
    "micro_batch": 8,
}
BIG_ARGS = [f"--model.{k}={v}" for k, v in BIG.items() if k != "micro_batch"] + [
    f"--train.micro_batch={BIG['micro_batch']}",
    "--train.precision=bf16",
    "--train.log_every=1",
]
# dense bf16 peak FLOP/s per device, from the vendors' data sheets (no sparsity)
PEAK_BF16 = [
    ("H200", 989.4e12),
    ("H100 SXM", 989.4e12),
    ("H100 80GB HBM3", 989.4e12),
    ("H100 PCIe", 756e12),
    ("H100", 756e12),
    ("A100", 312e12),
    ("L40S", 362.05e12),
]


@dataclass
class Step:
    name: str
    budget_s: int
    what: str
    strategy: str | None = None  # a train_entry run: --strategy
    args: list[str] = field(default_factory=list)
    steps: int = 0


def plan(gpus: int) -> list[Step]:
    g = f"--train.global_batch={8 * gpus}"
    gb = f"--train.global_batch={BIG['micro_batch'] * gpus}"
    return [
        Step("environment", 10, "nvidia-smi -L, torch CUDA/NCCL versions, device names"),
        Step("ddp", 30, "train_entry DDP on CUDA/NCCL", "ddp", [*SMALL, g], 20),
        Step(
            "fsdp_cpu_offload",
            40,
            "train_entry FSDP2 with CPUOffloadPolicy",
            "fsdp",
            [*SMALL, g, "--fsdp.cpu_offload=true"],
            12,
        ),
        Step(
            "deepspeed_zero2",
            40,
            "train_entry DeepSpeed ZeRO-2",
            "deepspeed",
            [*SMALL, g, "--deepspeed.zero_stage=2"],
            15,
        ),
        Step(
            "deepspeed_zero3",
            40,
            "train_entry DeepSpeed ZeRO-3",
            "deepspeed",
            [*SMALL, g, "--deepspeed.zero_stage=3"],
            15,
        ),
        Step(
            "big_gpt",
            45,
            "demo GPT (d 1024, 12 layers, seq 1024, bf16): steps/s, MFU, plan vs peak memory",
            "ddp",
            [*BIG_ARGS, gb],
            25,
        ),
        tp_fsdp(gpus, g),
        Step("doctor_nccl", 30, "hpctrain doctor --json: NCCL all-reduce sweep"),
        Step(
            "preempt_resume",
            60,
            "stop at step 8 -> exit 75 -> resume -> compare final params with an uninterrupted run",
            "ddp",
            [*SMALL, g, "--checkpoint.every_steps=4"],
            16,
        ),
    ]


def tp_fsdp(gpus: int, global_batch: str) -> Step:
    """FSDP2 x TP (tp 2, dp the rest) on the GPUs found; on an odd count (one GPU) a step that
    only says why it is skipped (strategy None: run_step reports it)."""
    what = "train_entry FSDP2 x TP (tp 2 inside the node, dp the rest) on NCCL"
    if gpus < 2 or gpus % 2:
        return Step("tp_fsdp", 1, f"{what}: skipped, it needs an even number of GPUs ({gpus})")
    return Step("tp_fsdp", 35, what, "fsdp", [*SMALL, global_batch, "--parallel.tp=2"], 12)


def check_plan(steps: list[Step], gpus: int) -> list[str]:
    """Problems with the plan itself (empty when it is sound); runs nothing."""
    problems = []
    total = sum(s.budget_s for s in steps)
    if total > TOTAL_BUDGET_S:
        problems.append(f"time limits add up to {total} s, more than {TOTAL_BUDGET_S} s")
    if len({s.name for s in steps}) != len(steps):
        problems.append("two steps share a name")
    from hpctrain.kernel.errors import UserError, ValidationError
    from train_entry.config import check_sizes, load_config

    for s in steps:
        if s.strategy is None:
            continue
        try:
            cfg = load_config(
                None, [f"--strategy={s.strategy}", *s.args, f"--train.max_steps={s.steps}"]
            )
            check_sizes(cfg, world=gpus)
        except (UserError, ValidationError) as e:
            problems.append(f"{s.name}: {e}")
    for path in (ROOT / "train_entry" / "__main__.py", Path(HPCTRAIN)):
        if not path.exists():
            problems.append(f"{path} is missing")
    return problems


def no_gpu_reason() -> str | None:
    """Why this machine cannot run the check, or None when it can."""
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi on PATH (no NVIDIA driver on this machine)"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if torch.version.cuda is None:
        return (
            f"torch {torch.__version__} is a CPU build; install a CUDA build, e.g. "
            "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
        )
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return "torch sees no CUDA device (driver too old, or CUDA_VISIBLE_DEVICES is empty)"
    return None
