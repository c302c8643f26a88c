"""`make gpu-check`: one prepared run (at most 5 minutes) of everything hpctrain has written for
NVIDIA GPUs but could not run without one. Results go to one JSON file (docs/gpu-check.md).

    make gpu-check                                  # = .venv/bin/python benchmarks/gpu_check.py
    .venv/bin/python benchmarks/gpu_check.py --out gpu-check.json --gpus 2
    .venv/bin/python benchmarks/gpu_check.py --plan  # check and print the plan, run nothing

Steps, each with its own time limit (the limits add up to at most 300 s): the environment
(nvidia-smi, torch's CUDA and NCCL); train_entry on CUDA with NCCL under DDP, FSDP2 with
CPUOffloadPolicy (`--fsdp.cpu_offload=true`), DeepSpeed ZeRO-2 and ZeRO-3; a bigger demo GPT
(bf16) for steps/s and MFU (model FLOPs per step / step time / the devices' peak), with `hpctrain
plan`'s predicted bytes per GPU against torch.cuda.max_memory_allocated; doctor's NCCL all-reduce
sweep; the nvidia-smi sampler's gpu.csv; a preemption (stop flag at a step, exit 75) and resume
whose final parameters are compared with an uninterrupted run's: bit-identical expected, else the
largest relative difference must be within --tolerance.

With no usable NVIDIA GPU (no nvidia-smi, a CPU build of torch, or no CUDA device) it checks its
own plan (every train_entry step's flags through train_entry's config loader, the batch arithmetic,
the time limits), says why it cannot run, writes the JSON with "gpu": false and exits 77, having
started nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Run as a script, the folder must not shadow anything; import the plan as benchmarks.gpu_plan.
if sys.path and Path(sys.path[0]).resolve() == HERE:
    sys.path.pop(0)
sys.path.insert(0, str(HERE.parent))

from benchmarks.gpu_plan import (  # noqa: E402, F401  (the plan; tests import it from here)
    BIG,
    BIG_ARGS,
    ENV_DEVICE,
    ENV_STOP_AT_STEP,
    HPCTRAIN,
    PEAK_BF16,
    PY,
    ROOT,
    SCHEMA,
    SKIPPED_EXIT,
    SMALL,
    TOTAL_BUDGET_S,
    Step,
    check_plan,
    no_gpu_reason,
    plan,
)

# Any: a step's record in the JSON report, built key by key from JSON (metrics rows, doctor's and
# plan's --json)
Record = dict[str, Any]


# ---------------------------------------------------------------- running (GPU machines only)
def child_env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e.update(
        DS_ACCELERATOR="cuda",
        DS_BUILD_OPS="0",
        OMP_NUM_THREADS="4",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    e.pop(ENV_DEVICE, None)
    e.update(extra)
    return e


def sh(cmd: list[str], timeout: float, log: Path, env: dict[str, str]) -> int:
    """Run a command (its own session, killed whole at the time limit); output to `log`."""
    with open(log, "ab") as out:
        p = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=child_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return 124


def rows(path: Path) -> list[Record]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if "step" in row:
                out.append(row)
    return out


def train(
    step: Step,
    work: Path,
    gpus: int,
    timeout: float,
    run_dir: Path | None = None,
    max_steps: int | None = None,
    env: dict[str, str] | None = None,
) -> Record:
    assert step.strategy, f"{step.name} is not a train_entry step"
    d = run_dir or work / step.name
    cmd = [
        PY,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={gpus}",
        "-m",
        "train_entry",
        "--strategy",
        step.strategy,
        "--run-dir",
        str(d),
        "--max-steps",
        str(max_steps or step.steps),
        *step.args,
    ]
    t0 = time.monotonic()
    rc = sh(cmd, timeout, work / f"{step.name}.log", env or {})
    r = rows(d / "metrics.jsonl")
    times = [x["time"] for x in r]
    gaps = sorted(b - a for a, b in zip(times[3:], times[4:], strict=False))
    res: Record = {
        "rc": rc,
        "wall_s": round(time.monotonic() - t0, 2),
        "run_dir": str(d),
        "steps_logged": len(r),
        "last_step": r[-1]["step"] if r else None,
        "steps_per_s": round(1 / gaps[len(gaps) // 2], 3) if gaps else None,
        "mem_peak_gib": r[-1].get("mem_peak_gib") if r else None,
        "final_params_sha256": (
            (d / "final_params.sha256").read_text().strip()
            if (d / "final_params.sha256").exists()
            else None
        ),
    }
    res["ok"] = rc == 0 and res["last_step"] == (max_steps or step.steps)
    return res


def gpt_flops_per_step(params: int, tokens: int) -> float:
    """6 N T for the dense layers, plus the attention scores and values (12 L d s per token)."""
    return 6.0 * params * tokens + 12.0 * BIG["n_layers"] * BIG["d_model"] * BIG["seq_len"] * tokens


def run_step(step: Step, work: Path, gpus: int) -> Record:
    limit = step.budget_s
    if step.name == "environment":
        import torch

        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=limit)
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else None
        return {
            "ok": smi.returncode == 0,
            "nvidia_smi_L": smi.stdout.strip().splitlines(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
            "devices": names,
            "gpus_used": gpus,
        }
    if step.name == "doctor_nccl":
        p = subprocess.run(
            [
                HPCTRAIN,
                "doctor",
                "--profile",
                "local",
                "--gpus",
                str(gpus),
                "--max-mib",
                "256",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=limit,
            cwd=work,
            env=child_env(**{ENV_DEVICE: "cuda"}),
        )
        try:
            report = json.loads(p.stdout)
        except ValueError:
            return {"ok": False, "rc": p.returncode, "output_tail": (p.stdout + p.stderr)[-2000:]}
        sweep = report.get("sweep") or {}
        return {
            "ok": p.returncode == 0 and bool(sweep.get("rows")),
            "rc": p.returncode,
            "sweep": sweep,
            "report": report,
        }
    if step.name == "tp_fsdp" and step.strategy is None:
        return {"ok": True, "skipped": f"tensor parallel needs 2 GPUs; this machine has {gpus}"}
    if step.name == "preempt_resume":
        t0 = time.monotonic()
        ref = train(step, work, gpus, limit / 3, run_dir=work / "ref")
        left = limit - (time.monotonic() - t0)
        stopped = train(
            step, work, gpus, left / 2, run_dir=work / "preempted", env={ENV_STOP_AT_STEP: "8"}
        )
        left = limit - (time.monotonic() - t0)
        resumed = train(step, work, gpus, left, run_dir=work / "preempted")
        same = (
            ref["final_params_sha256"] is not None
            and ref["final_params_sha256"] == resumed["final_params_sha256"]
        )
        out: Record = {
            "reference": ref,
            "stopped": stopped,
            "resumed": resumed,
            "stopped_rc_75": stopped["rc"] == 75,
            "bit_identical": same,
        }
        if not same and ref["ok"] and resumed["ok"]:
            out["max_rel_diff"] = max_rel_diff(work / "ref", work / "preempted", step.steps)
        out["ok"] = (
            stopped["rc"] == 75
            and resumed["ok"]
            and (
                same
                or (out.get("max_rel_diff") is not None and out["max_rel_diff"] <= ARGS.tolerance)
            )
        )
        return out
    res = train(step, work, gpus, limit)
    if step.name == "ddp":
        csv = work / "ddp" / "gpu.csv"
        lines = csv.read_text().splitlines() if csv.exists() else []
        res["nvidia_smi_sampler"] = {"gpu_csv_lines": len(lines), "head": lines[:3]}
        res["ok"] = res["ok"] and len(lines) >= 2
    if step.name == "big_gpt" and res["steps_per_s"]:
        res.update(mfu_and_memory(res, gpus, work))
    return res


def mfu_and_memory(res: Record, gpus: int, work: Path) -> Record:
    import torch

    from train_entry.config import load_config
    from train_entry.model import build_model

    cfg = load_config(None, BIG_ARGS)
    with torch.device("meta"):
        params = sum(p.numel() for p in build_model(cfg, rank=0, world_size=1).parameters())
    tokens = BIG["micro_batch"] * BIG["seq_len"] * gpus
    flops = gpt_flops_per_step(params, tokens)
    name = torch.cuda.get_device_name(0)
    peak = (
        ARGS.peak_tflops * 1e12
        if ARGS.peak_tflops
        else next((p for key, p in PEAK_BF16 if key in name), None)
    )
    out: Record = {
        "params": params,
        "tokens_per_step": tokens,
        "model_flops_per_step": flops,
        "device": name,
        "peak_flops_per_device": peak,
        "mfu": round(flops * res["steps_per_s"] / (peak * gpus), 4) if peak else None,
    }
    p = subprocess.run(
        [
            HPCTRAIN,
            "plan",
            "--params",
            str(params),
            "--precision",
            "bf16",
            "--nodes",
            "1",
            "--gpus",
            str(gpus),
            "--micro-batch",
            str(BIG["micro_batch"]),
            "--seq-len",
            str(BIG["seq_len"]),
            "--hidden",
            str(BIG["d_model"]),
            "--layers",
            str(BIG["n_layers"]),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=work,
        env=child_env(),
    )
    try:
        ddp = next(s for s in json.loads(p.stdout)["strategies"] if s["name"] == "ddp")
        predicted = (
            ddp["model_state_bytes_per_gpu"]
            + ddp["activation_bytes_per_gpu"]
            + ddp.get("transient_bytes", 0)
        )
        measured = max(res["mem_peak_gib"]) * 2**30 if res["mem_peak_gib"] else None
        out["plan_memory"] = {
            "predicted_bytes_per_gpu": predicted,
            "max_memory_allocated_bytes": measured,
            "measured_over_predicted": round(measured / predicted, 3) if measured else None,
            "plan_ddp": ddp,
        }
    except (ValueError, KeyError, StopIteration) as e:
        out["plan_memory"] = {"error": f"{e!r}: {(p.stdout + p.stderr)[-500:]}"}
    return out


def max_rel_diff(a: Path, b: Path, step: int) -> float | None:
    """max |a - b| / max |a| over the final checkpoints' model tensors."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folders = [d / "checkpoints" / f"step-{step:08d}" for d in (a, b)]
    with tempfile.TemporaryDirectory() as tmp:
        sds = []
        for i, f in enumerate(folders):
            dcp_to_torch_save(f, Path(tmp) / f"{i}.pt")
            sds.append(torch.load(Path(tmp) / f"{i}.pt", weights_only=False)["app"]["model"])
    worst = 0.0
    for k, x in sds[0].items():
        y = sds[1][k]
        scale = x.abs().max().item() or 1.0
        worst = max(worst, (x.float() - y.float()).abs().max().item() / scale)
    return worst


def main(argv: list[str] | None = None) -> int:
    global ARGS
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=ROOT / "gpu-check.json")
    ap.add_argument("--gpus", type=int, help="GPUs to use (default: all visible, at most 8)")
    ap.add_argument("--plan", action="store_true", help="check and print the plan, run nothing")
    ap.add_argument(
        "--tolerance",
        type=float,
        default=1e-5,
        help="preempt+resume: largest relative parameter difference accepted when "
        "not bit-identical (default 1e-5)",
    )
    ap.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak, for MFU")
    ARGS = ap.parse_args(argv)

    reason = no_gpu_reason()
    gpus = ARGS.gpus or 2
    if reason is None and not ARGS.gpus:
        import torch

        gpus = max(1, min(8, torch.cuda.device_count()))
    steps = plan(gpus)
    problems = check_plan(steps, gpus)
    report: Record = {
        "schema": SCHEMA,
        "gpu": reason is None,
        "reason": reason,
        "gpus": gpus,
        "budget_s": TOTAL_BUDGET_S,
        "plan": [asdict(s) for s in steps],
        "plan_problems": problems,
        "steps": {},
        "ok": None,
    }
    print(
        f"gpu-check plan ({gpus} GPU(s), {sum(s.budget_s for s in steps)} s of {TOTAL_BUDGET_S} s):"
    )
    for s in steps:
        print(f"  {s.name:18} {s.budget_s:4d} s  {s.what}")
    print("plan: ok" if not problems else "plan problems:\n  " + "\n  ".join(problems))
    if problems or reason is not None or ARGS.plan:
        ARGS.out.write_text(json.dumps(report, indent=1) + "\n")
        if reason is not None:
            print(
                f"no NVIDIA GPU usable here: {reason}; nothing was run (exit {SKIPPED_EXIT}). "
                f"Run `make gpu-check` on a machine with one. Wrote {ARGS.out}"
            )
            return SKIPPED_EXIT if not problems else 1
        return 1 if problems else 0

    work = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=ROOT / "benchmarks"))
    t0 = time.monotonic()
    for s in steps:
        print(f"== {s.name} (limit {s.budget_s} s)", flush=True)
        try:
            res = run_step(s, work, gpus)
        except Exception as e:  # noqa: BLE001 - one failed step must not lose the others
            res = {"ok": False, "error": repr(e)}
        report["steps"][s.name] = res
        print(
            f"   {'ok' if res.get('ok') else 'FAILED'}: "
            + json.dumps({k: v for k, v in res.items() if not isinstance(v, (dict, list))})[:400],
            flush=True,
        )
        ARGS.out.write_text(json.dumps(report, indent=1) + "\n")  # partial results survive
    report["wall_s"] = round(time.monotonic() - t0, 1)
    report["work_dir"] = str(work)
    report["ok"] = all(r.get("ok") for r in report["steps"].values())
    ARGS.out.write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"gpu-check {'passed' if report['ok'] else 'FAILED'} in {report['wall_s']} s; "
        f"wrote {ARGS.out} (logs and run folders in {work})"
    )
    return 0 if report["ok"] else 1


ARGS: argparse.Namespace


if __name__ == "__main__":
    sys.exit(main())
