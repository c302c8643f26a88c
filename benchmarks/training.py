"""1. Training overhead: steady-state steps/s of train_entry over plain loops of the same model.

train_entry (DDP, FSDP2, DeepSpeed ZeRO; 2 processes, gloo, the demo GPT) against a plain
hand-written loop of each kind (benchmarks/baselines/plain_*.py) and against Hugging Face Accelerate
driving the same model. Same model, data, batch and optimizer on both sides (benchmarks/demo.py
builds them with train_entry's own config and factories). Steady state: the first `warmup` steps of
every run are skipped (train_entry: metrics.jsonl timestamps; baselines: their own step clock), so
start-up is excluded on both sides. Repetitions are interleaved; the ratio is of the medians.

The ratio is of typical steps/s, 1 / the median step time, which steps that wait for a peer
descheduled by other jobs do not move; the mean-rate ratio is kept beside it in the details
(`mean_rate_ratio`). Even so, on a shared machine the same plain loop ran 1.4x faster in one run
than in another a minute later: read these ratios together with the load average.
"""

from __future__ import annotations

import json

from benchmarks import common

# A model big enough that a step is real work (the shared notes' measuring size), small enough for
# 2 shared cores. Both sides get exactly these overrides.
TRAIN_ARGS = ["--model.d_model=256", "--model.n_layers=4", "--model.n_heads=4",
              "--model.seq_len=64", "--train.global_batch=16", "--train.micro_batch=8",
              "--train.log_every=1"]


def metrics_times(run_dir) -> list[float]:
    """Completion time of each logged step from train_entry's metrics.jsonl (one row per step)."""
    rows = [r for r in common.read_jsonl(run_dir / "metrics.jsonl") if "step" in r]
    if not rows:
        raise common.NotMeasured(f"train_entry wrote no metrics rows in {run_dir}/metrics.jsonl")
    if "time" not in rows[0]:
        raise common.NotMeasured(f"metrics.jsonl rows have no 'time' (keys: {sorted(rows[0])})")
    steps = [r["step"] for r in rows]
    if steps != list(range(steps[0], steps[0] + len(steps))):
        raise common.NotMeasured("metrics.jsonl is not one row per step; need --train.log_every=1")
    return [float(r["time"]) for r in rows]


def rates(times: list[float], warmup: int) -> tuple[float, float]:
    """(typical steps/s from the median step time, mean steps/s), both after warm-up."""
    return (common.typical_steps_per_s(times, warmup), common.steady_steps_per_s(times, warmup))


def run_train_entry(strategy: str, steps: int, warmup: int) -> tuple[float, float]:
    d = common.scratch(f"train-{strategy}-")
    common.run([*common.torchrun(2), "-m", "train_entry", "--strategy", strategy,
                "--run-dir", str(d), "--max-steps", str(steps), *TRAIN_ARGS], timeout=600)
    return rates(metrics_times(d), warmup)


def run_baseline(script: str, steps: int, warmup: int) -> tuple[float, float]:
    out = common.scratch("base-") / "steps.json"
    common.run([*common.torchrun(2), str(common.BASELINES / script), "--max-steps", str(steps),
                "--out", str(out)], timeout=600,
               BENCH_TRAIN_ARGS=json.dumps([*TRAIN_ARGS, f"--train.max_steps={steps}"]))
    return rates(json.loads(out.read_text())["step_times"], warmup)


def compare(sides: dict, reps: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Run every side once per repetition, in turn, so load changes hit all sides alike.
    Returns (typical steps/s, mean steps/s) per side and repetition."""
    typical: dict[str, list[float]] = {k: [] for k in sides}
    mean: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(reps):
        for k, fn in sides.items():
            t, m = fn()
            typical[k].append(t)
            mean[k].append(m)
    return typical, mean


def row(name: str, target: str, label: str, typical: dict, mean: dict, a: str, b: str,
        setup: dict) -> dict:
    """The ratio of typical steps/s (median step time), the mean-rate ratio beside it."""
    ta, tb = common.median(typical[a]), common.median(typical[b])
    ma, mb = common.median(mean[a]), common.median(mean[b])
    return common.measured(
        name, ta / tb, target, **setup, steps_per_s_typical={a: typical[a], b: typical[b]},
        steps_per_s_mean={a: mean[a], b: mean[b]}, mean_rate_ratio=round(ma / mb, 4),
        summary=f"{label}: {ta:.2f} vs {tb:.2f} steps/s (from the median step time); "
                f"mean rate {ma:.2f} vs {mb:.2f} steps/s (ratio {ma / mb:.3f})")


def run(quick: bool) -> list[dict]:
    reps, steps, warmup = (2, 20, 6) if quick else (5, 80, 20)
    reps = common.reps(reps)
    setup = {"train_args": TRAIN_ARGS, "processes": 2, "backend": "gloo", "reps": reps,
             "steps": steps, "warmup_steps_skipped": warmup}
    rows = []

    # DDP, plain DDP and Accelerate interleaved: the train_entry DDP runs serve both ratios.
    try:
        typical, mean = compare({
            "train_entry": lambda: run_train_entry("ddp", steps, warmup),
            "plain_ddp": lambda: run_baseline("plain_ddp.py", steps, warmup),
            "accelerate": lambda: run_baseline("accelerate_loop.py", steps, warmup),
        }, reps)
        rows.append(row("training_ddp_vs_plain_ddp", ">= 0.98", "train_entry DDP vs plain DDP",
                        typical, mean, "train_entry", "plain_ddp", setup))
        rows.append(row("training_ddp_vs_accelerate", ">= 1.0", "train_entry DDP vs Accelerate",
                        typical, mean, "train_entry", "accelerate", setup))
    except common.NotMeasured as e:
        rows.append(common.not_measured("training_ddp_vs_plain_ddp", ">= 0.98", str(e)))
        rows.append(common.not_measured("training_ddp_vs_accelerate", ">= 1.0", str(e)))

    for strategy, script, label in (("fsdp", "plain_fsdp.py", "FSDP2"),
                                    ("deepspeed", "plain_deepspeed.py", "DeepSpeed")):
        name, base = f"training_{strategy}_vs_plain_{strategy}", f"plain_{strategy}"
        try:
            typical, mean = compare({
                "train_entry": lambda s=strategy: run_train_entry(s, steps, warmup),
                base: lambda b=script: run_baseline(b, steps, warmup),
            }, reps)
            rows.append(row(name, ">= 0.98", f"train_entry {label} vs plain {label}", typical,
                            mean, "train_entry", base, setup))
        except common.NotMeasured as e:
            rows.append(common.not_measured(name, ">= 0.98", str(e)))
    return rows
