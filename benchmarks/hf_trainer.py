"""Hugging Face Trainer: steps/s with hpctrain's one line (`callbacks=[HpctrainCallback()]`) over
the same Trainer without it. Target >= 0.98.

Both sides: benchmarks/workers/hf_side.py under torchrun, 2 processes, gloo (a GPT-2 from a config:
256 wide, 4 layers, sequence 32, 8 samples per rank, AdamW, Trainer's logging every 10 steps, no
checkpoint while measured) and one completion-time line per step on rank 0. The callback side also
runs what a job runs at every step: the stop vote (an async all-reduce read at the next step), a
metrics.jsonl line at most once a second and at Trainer's logs. Interleaved by pausing
(benchmarks/interleave.py): one launch per side, segments of K steps in turn; the row is the
median of the per-repetition ratios with their spread.
"""

from __future__ import annotations

from benchmarks import common, interleave
from benchmarks.training import Side

MAX_STEPS = 100_000  # the sides are killed once measured
WORKER = common.ROOT / "benchmarks" / "workers" / "hf_side.py"


def side(name: str, *extra: str) -> Side:
    d = common.scratch(f"hf-{name}-")
    run = d / "run"
    run.mkdir()
    env = {"BENCH_PROGRESS": str(d / "progress.txt")}
    if extra:  # an hpctrain job's environment: the run folder and its stop file
        from hpctrain.kernel import jobenv

        env |= {jobenv.RUN_DIR: str(run), jobenv.STOP_FILE: str(run / "STOP")}
    return Side(
        name=name,
        progress=d / "progress.txt",
        log=d / "out.log",
        cmd=[*common.torchrun(2), str(WORKER), str(d / "out"), str(MAX_STEPS), *extra],
        env=env,
    )


def run(quick: bool) -> list[common.Row]:
    # 60-step segments: with 10 (30) the per-repetition ratios spread 0.970-0.997 (0.976-1.003)
    # (IQR, quiet machine) around a CPU time per step equal on both sides: too wide for 2%
    reps, segment, warmup = (3, 10, 5) if quick else (7, 60, 6)
    reps = max(3, common.reps(reps))
    name, target = "hf_trainer_callback_vs_none", ">= 0.98"
    try:
        sides = [side("with_callback", "--hpctrain"), side("without")]
        rates = interleave.run(list(sides), warmup=warmup, segment=segment, reps=reps)
    except common.NotMeasured as e:
        return [common.not_measured(name, target, str(e))]
    a, b = rates["with_callback"], rates["without"]
    cpu = {s.name: s.cpu_ms_per_step() for s in sides}
    return [
        common.settle(
            name,
            [x / y for x, y in zip(a, b, strict=True)],
            target,
            processes=2,
            backend="gloo",
            reps=reps,
            segment_steps=segment,
            warmup_steps_skipped=warmup,
            steps_per_s_typical={"with_callback": a, "without": b},
            cpu_ms_per_step=cpu,
            summary=f"Trainer with HpctrainCallback vs without: {common.median(a):.2f} vs "
            f"{common.median(b):.2f} steps/s (median over segments of 1 / median step interval); "
            f"CPU {cpu['with_callback'] or 0:.0f} vs {cpu['without'] or 0:.0f} ms/step (both "
            "ranks). Same model, data, batch, optimizer, logging; the callback side votes on the "
            "stop flag each step (async all-reduce) and writes metrics.jsonl",
        )
    ]
