"""1. Training overhead: steady-state steps/s of train_entry over plain loops of the same model.

train_entry (DDP, FSDP2, DeepSpeed ZeRO; 2 processes, gloo, the demo GPT) against a plain
hand-written loop of each kind (benchmarks/baselines/plain_*.py) and against Hugging Face Accelerate
driving the same model. Same model, data, batch and optimizer on both sides (benchmarks/demo.py
builds them with train_entry's own config and factories). Steady state: the first `warmup` steps of
every run are skipped (train_entry: metrics.jsonl timestamps; baselines: their own step clock), so
start-up is excluded on both sides. Repetitions are interleaved; the ratio is of the medians.
"""

from __future__ import annotations

import json

from benchmarks import common

# A model big enough that a step is real work (the shared notes' measuring size), small enough for
# 2 shared cores. Both sides get exactly these overrides.
TRAIN_ARGS = ["--model.d_model=256", "--model.n_layers=4", "--model.n_heads=4",
              "--model.seq_len=64", "--train.global_batch=16", "--train.micro_batch=8",
              "--train.log_every=1"]
TIME_KEYS = ("time", "timestamp", "t", "wall_time", "unix_time")


def metrics_times(run_dir) -> list[float]:
    """Completion time of each logged step from train_entry's metrics.jsonl (one row per step)."""
    rows = [r for r in common.read_jsonl(run_dir / "metrics.jsonl") if "step" in r]
    if not rows:
        raise common.NotMeasured(f"train_entry wrote no metrics rows in {run_dir}/metrics.jsonl")
    key = next((k for k in TIME_KEYS if k in rows[0]), None)
    if key is None:
        raise common.NotMeasured(f"metrics.jsonl rows have no timestamp (keys: {sorted(rows[0])})")
    steps = [r["step"] for r in rows]
    if steps != list(range(steps[0], steps[0] + len(steps))):
        raise common.NotMeasured("metrics.jsonl is not one row per step; need --train.log_every=1")
    return [float(r[key]) for r in rows]


def run_train_entry(strategy: str, steps: int, warmup: int) -> float:
    d = common.scratch(f"train-{strategy}-")
    common.run([*common.torchrun(2), "-m", "train_entry", "--strategy", strategy,
                "--run-dir", str(d), "--max-steps", str(steps), *TRAIN_ARGS], timeout=600)
    return common.steady_steps_per_s(metrics_times(d), warmup)


def run_baseline(script: str, steps: int, warmup: int) -> float:
    out = common.scratch("base-") / "steps.json"
    common.run([*common.torchrun(2), str(common.BASELINES / script), "--max-steps", str(steps),
                "--out", str(out)], timeout=600,
               BENCH_TRAIN_ARGS=json.dumps([*TRAIN_ARGS, f"--train.max_steps={steps}"]))
    return common.steady_steps_per_s(json.loads(out.read_text())["step_times"], warmup)


def compare(sides: dict, reps: int) -> dict[str, list[float]]:
    """Run every side once per repetition, in turn, so load changes hit all sides alike."""
    got: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(reps):
        for k, fn in sides.items():
            got[k].append(fn())
    return got


def run(quick: bool) -> list[dict]:
    reps, steps, warmup = (2, 20, 6) if quick else (5, 80, 20)
    reps = common.reps(reps)
    setup = {"train_args": TRAIN_ARGS, "processes": 2, "backend": "gloo", "reps": reps,
             "steps": steps, "warmup_steps_skipped": warmup}
    rows = []

    # DDP, plain DDP and Accelerate interleaved: the train_entry DDP runs serve both ratios.
    try:
        got = compare({
            "train_entry": lambda: run_train_entry("ddp", steps, warmup),
            "plain": lambda: run_baseline("plain_ddp.py", steps, warmup),
            "accelerate": lambda: run_baseline("accelerate_loop.py", steps, warmup),
        }, reps)
        te, plain, acc = (common.median(got[k]) for k in ("train_entry", "plain", "accelerate"))
        rows.append(common.measured(
            "training_ddp_vs_plain_ddp", te / plain, ">= 0.98", **setup,
            steps_per_s={"train_entry": got["train_entry"], "plain_ddp": got["plain"]},
            summary=f"train_entry DDP {te:.2f} steps/s, plain DDP loop {plain:.2f} steps/s"))
        rows.append(common.measured(
            "training_ddp_vs_accelerate", te / acc, ">= 1.0", **setup,
            steps_per_s={"train_entry": got["train_entry"], "accelerate": got["accelerate"]},
            summary=f"train_entry DDP {te:.2f} steps/s, Accelerate {acc:.2f} steps/s"))
    except common.NotMeasured as e:
        rows.append(common.not_measured("training_ddp_vs_plain_ddp", ">= 0.98", str(e)))
        rows.append(common.not_measured("training_ddp_vs_accelerate", ">= 1.0", str(e)))

    for strategy, script, label in (("fsdp", "plain_fsdp.py", "FSDP2"),
                                    ("deepspeed", "plain_deepspeed.py", "DeepSpeed")):
        name = f"training_{strategy}_vs_plain_{strategy}"
        try:
            got = compare({
                "train_entry": lambda s=strategy: run_train_entry(s, steps, warmup),
                "plain": lambda b=script: run_baseline(b, steps, warmup),
            }, reps)
            te, plain = common.median(got["train_entry"]), common.median(got["plain"])
            rows.append(common.measured(
                name, te / plain, ">= 0.98", **setup,
                steps_per_s={"train_entry": got["train_entry"], f"plain_{strategy}": got["plain"]},
                summary=f"train_entry {label} {te:.2f} steps/s, plain {label} loop {plain:.2f} steps/s"))
        except common.NotMeasured as e:
            rows.append(common.not_measured(name, ">= 0.98", str(e)))
    return rows
