"""Hugging Face Trainer: steps/s with hpctrain's one line (`callbacks=[HpctrainCallback()]`) over
the same Trainer without it. Target >= 0.98.

Both sides: benchmarks/workers/hf_side.py under torchrun, 2 processes, gloo (a GPT-2 from a config:
256 wide, 4 layers, sequence 32, 8 samples per rank, AdamW, Trainer's logging every 10 steps, no
checkpoint while measured) and one completion-time line per step on rank 0. The callback side also
runs what a job runs at every step: the stop vote (an async all-reduce read at the next step), a
metrics.jsonl line at most once a second and at Trainer's logs. Interleaved by pausing
(benchmarks/interleave.py): one launch per side; a repetition is 4 rounds of one 10-step
segment per side; the row is the median of the per-repetition ratios with their spread.
hf_trainer_noise_same_launch (stated): the side without the callback, its odd rounds over its
even ones per repetition (benchmarks/training.py's noise row has the launch-to-launch part).
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
    # one 60-step segment per side per repetition read 0.950-0.998 (IQR, 2026-12-06): now 4
    # rounds of 10 steps, the ratio over 4 x 9 intervals spread across the repetition
    reps, block, segment, warmup = (3, 2, 10, 5) if quick else (5, 4, 10, 6)
    reps = max(3, common.reps(reps))
    name, target = "hf_trainer_callback_vs_none", ">= 0.98"
    noise = "hf_trainer_noise_same_launch"
    try:
        sides = [side("with_callback", "--hpctrain"), side("without")]
        got = interleave.run(list(sides), warmup=warmup, segment=segment, reps=reps, block=block)
        a, b = got.rates("with_callback"), got.rates("without")
        aa = got.same_launch("without")
    except common.NotMeasured as e:
        return [common.not_measured(name, target, str(e)), common.not_measured(noise, "-", str(e))]
    cpu = {s.name: s.cpu_ms_per_step() for s in sides}
    setup = {
        "processes": 2,
        "backend": "gloo",
        "reps": reps,
        "rounds_per_rep": block,
        "segment_steps": segment,
        "warmup_steps_skipped": warmup,
    }
    return [
        common.settle(
            name,
            got.ratios("with_callback", "without"),
            target,
            **setup,
            steps_per_s_typical={"with_callback": a, "without": b},
            cpu_ms_per_step=cpu,
            summary=f"Trainer with HpctrainCallback vs without: {common.median(a):.2f} vs "
            f"{common.median(b):.2f} steps/s (median over repetitions of 1 / median step "
            f"interval); CPU {cpu['with_callback'] or 0:.0f} vs {cpu['without'] or 0:.0f} ms/step "
            "(both ranks). Same model, data, batch, optimizer, logging; the callback side votes "
            "on the stop flag each step (async all-reduce) and writes metrics.jsonl",
        ),
        common.noise(
            noise,
            aa,
            "the Trainer without the callback, its odd rounds over its even ones per repetition "
            "(one launch; training_noise_plain_ddp_twice has two)",
            **setup,
        ),
    ]
