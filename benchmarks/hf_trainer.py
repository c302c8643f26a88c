"""Hugging Face Trainer: steps/s with hpctrain's one line (`callbacks=[HpctrainCallback()]`) over
the same Trainer without it. Target >= 0.98.

benchmarks/workers/hf_side.py under torchrun, 2 processes, gloo (a GPT-2 from a config: 256 wide,
4 layers, sequence 32, 8 samples per rank, AdamW, Trainer's logging every 10 steps, no checkpoint
while measured), one completion-time line per step on rank 0. With the callback on, a step also
runs what a job runs at every step: the stop vote (an async all-reduce read at the next step), a
metrics.jsonl line at most once a second and at Trainer's logs.

One launch: the callback on and off in alternating segments of the same processes, ABBA (on(j)),
`block` pairs per repetition. A side's rate in a repetition is 1 / the median step interval over
its segments, the first interval of each segment left out (it holds the other side's last
step's vote, read late); the row is the median of the per-repetition ratios with their spread.
One launch per side, interleaved by pausing (through 2026-12-07), read 0.951-0.993 (IQR) and a
second launch of one side runs up to 5% apart from the first (benchmarks/workers/paired.py).
hf_trainer_noise_same_launch (stated): the "off" segments that open a pair over those that close
one, per repetition.
"""

from __future__ import annotations

from benchmarks import common

WORKER = common.ROOT / "benchmarks" / "workers" / "hf_side.py"


def on(j: int) -> bool:
    """Is segment j (from 0) an "on" segment? on, off, off, on, ...: ABBA."""
    return j % 4 in (0, 3)


def rates(times: list[float], warmup: int, segment: int, pairs: int) -> dict[str, list[float]]:
    """Per repetition (`pairs` segment pairs): 1 / the median step interval of the "on" and the
    "off" segments, and of the "off" segments that open a pair and those that close one."""
    gaps: dict[str, list[list[float]]] = {}
    n = (len(times) - warmup) // segment
    for j in range(n):
        first = warmup + j * segment  # index in `times` of the segment's first step
        seg = [
            b - a
            for a, b in zip(
                times[first : first + segment], times[first + 1 : first + segment], strict=False
            )
        ]
        rep = j // (2 * pairs)
        kinds = ["on"] if on(j) else ["off", "off_open" if j % 2 == 0 else "off_close"]
        for k in kinds:
            per = gaps.setdefault(k, [])
            while len(per) <= rep:
                per.append([])
            per[rep] += seg
    return {k: [1.0 / common.median(g) for g in v if g] for k, v in gaps.items()}


def run(quick: bool) -> list[common.Row]:
    reps, pairs, segment, warmup = (3, 2, 10, 5) if quick else (7, 4, 10, 6)
    reps = max(3, common.reps(reps))
    name, target = "hf_trainer_callback_vs_none", ">= 0.98"
    noise = "hf_trainer_noise_same_launch"
    d = common.scratch("hf-")
    run_dir = d / "run"
    run_dir.mkdir()
    progress = d / "progress.txt"
    from hpctrain.kernel import jobenv  # an hpctrain job's environment: its folder and stop file

    steps = warmup + reps * pairs * 2 * segment
    try:
        common.run(
            [
                *common.torchrun(2),
                str(WORKER),
                str(d / "out"),
                str(steps),
                str(warmup),
                str(segment),
            ],
            timeout=900,
            extra_env={
                "BENCH_PROGRESS": str(progress),
                jobenv.RUN_DIR: str(run_dir),
                jobenv.STOP_FILE: str(run_dir / "STOP"),
            },
        )
        times = [float(x) for x in progress.read_text().split()]
        got = rates(times, warmup, segment, pairs)
        a, b = got["on"][:reps], got["off"][:reps]
    except (common.NotMeasured, OSError, KeyError, ValueError) as e:
        return [common.not_measured(name, target, str(e)), common.not_measured(noise, "-", str(e))]
    setup = {
        "processes": 2,
        "backend": "gloo",
        "reps": reps,
        "pairs_per_rep": pairs,
        "segment_steps": segment,
        "warmup_steps": warmup,
        "method": "one launch, the callback on and off in alternating segments (ABBA)",
    }
    return [
        common.settle(
            name,
            [x / y for x, y in zip(a, b, strict=True)],
            target,
            **setup,
            steps_per_s_typical={"with_callback": a, "without": b},
            summary=f"Trainer with HpctrainCallback vs without: {common.median(a):.2f} vs "
            f"{common.median(b):.2f} steps/s (median over repetitions of 1 / median step "
            "interval), one process pair, the callback on and off in alternating segments. "
            "Same model, data, batch, optimizer, logging; with it, each step votes on the stop "
            "flag (async all-reduce) and writes metrics.jsonl",
        ),
        common.noise(
            noise,
            [x / y for x, y in zip(got["off_close"], got["off_open"], strict=False)],
            'the callback\'s "off" segments that close an ABBA pair over those that open one, '
            "per repetition (the rows read on over off the same way)",
            **setup,
        ),
    ]
