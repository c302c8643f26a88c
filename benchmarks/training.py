"""1. Training overhead: steady-state steps/s of train_entry over plain loops of the same model.

train_entry (DDP, FSDP2, DeepSpeed ZeRO; 2 processes, gloo, the demo GPT) against a plain
hand-written loop of each kind (benchmarks/baselines/loops.py) and against Hugging Face Accelerate
driving the same model. Same model, data, batch and optimizer on both sides (benchmarks/demo.py
builds them with train_entry's own config and factories).

What each side does per optimizer step (TRAIN_ARGS: d_model 256, 4 layers, seq 64, global batch 16
= 2 ranks x micro 8 x accum 1, fp32, AdamW, warmup + cosine schedule, clip at 1.0):
  - every side: the same demo GPT and seed, the same Progressions samples through a torch
    DataLoader (num_workers 0, default collate) with a shuffled DistributedSampler(seed,
    drop_last) and set_epoch (Accelerate: its own sharded loader of the same data), forward,
    backward with the gradient all-reduce (DDP, torch defaults: 25 MiB buckets; FSDP2:
    fully_shard per block then the root, reduce-scatter; DeepSpeed: ZeRO-2, torch AdamW as a
    client optimizer), the global grad-norm clip, the optimizer and LR schedule steps, zero_grad;
  - the plain loops: `loss.item()` of the rank's loss;
  - train_entry: everything a run does at log_every=1: the loss averaged over ranks and the
    preemption stop votes in one all-reduce (launched without waiting, read at the next step,
    train_entry/stepsync.py), one metrics.jsonl line, one train.log line and one stdout line on
    rank 0, the checkpoint trigger check, the stall heartbeat; its DDP uses
    gradient_as_bucket_view (a train_entry default) and a bucket layout fixed at start (exact
    resume). No checkpoint is saved while measured (none is due).

One launch per group, the sides in its processes (benchmarks/workers/paired.py): train_entry runs
as a job runs it, and at the start of its step where the schedule says so the plain loops
(benchmarks/baselines/loops.py, each with its own copy of the model, data and optimizer) run
their segments first. After every side's warm-up and one uncounted round, a repetition is
`block` rounds of one 8-step segment per side, the order rotating. A repetition's ratio is
train_entry's typical steps/s (1 / the median step interval over its segments, rank 0's
clock; each segment's first step, after the switch, left out) over the plain loop's in the same
repetition; the row is the median of those ratios with their spread, "not settled" when the
spread straddles the target.

Why one launch: two launches of the same loop run up to 5% apart here for their whole lives.
With one launch per side, paused in turn (through 2026-12-07), the A/A of two plain DDP
launches read 0.996 [0.991-1.003] at 21:19 and 1.048 [1.033-1.053] at 00:26 the next night,
and the rows flipped between runs (TP 2 on 2 ranks: 0.966 missed, then 1.051 met); more
repetitions in one launch do not average a launch's bias away. In one launch both sides share it.

training_noise_plain_ddp_twice (stated): a second plain DDP loop (its own model copy) in the DDP
launch, its steps/s over the first's per repetition: the noise of this method where nothing
differs.

Each row's details also give the CPU time per step of each side (user + system of every rank's
process, every thread, over its segments).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from benchmarks import common

# A model big enough that a step is real work (the shared notes' measuring size), small enough for
# 2 shared cores. Both sides get exactly these overrides.
TRAIN_ARGS = [
    "--model.d_model=256",
    "--model.n_layers=4",
    "--model.n_heads=4",
    "--model.seq_len=64",
    "--train.global_batch=16",
    "--train.micro_batch=8",
    "--train.log_every=1",
]
MAX_STEPS = 100_000  # the sides are killed once measured
TE = "train_entry"

_COMMON = (
    "demo GPT, DataLoader + DistributedSampler(shuffle, seed), forward, backward with the "
    "gradient all-reduce, clip 1.0, AdamW, LR schedule, zero_grad"
)
SIDES = {  # what each side does per optimizer step (the module's docstring has the whole list)
    "train_entry": f"{_COMMON}; one async all-reduce of [loss sum, stop votes] read at the next "
    "step; metrics.jsonl + train.log + stdout line on rank 0; heartbeat and checkpoint trigger "
    "checks; DDP: gradient_as_bucket_view, fixed bucket layout",
    "plain_ddp": f"{_COMMON}; DDP(model) with torch defaults, no_sync on non-final micro-steps; "
    "loss.item()",
    "accelerate": f"{_COMMON} (Accelerate's sharded loader); accelerator.prepare (DDP with torch "
    "defaults), accumulate(), accelerator.backward/clip_grad_norm_; loss.item()",
    "plain_fsdp": f"{_COMMON}; fully_shard per block then the root; set_requires_gradient_sync; "
    "loss.item()",
    "plain_deepspeed": f"{_COMMON}; deepspeed.initialize (ZeRO-2, torch AdamW client optimizer, "
    "gradient_clipping 1.0), engine.backward/step; loss.item()",
    "plain_tp": "DeviceMesh (dp, tp), parallelize_module (colwise/rowwise, sequence parallel, "
    "vocab-parallel embedding and head), loss_parallel, fully_shard over dp, clip, AdamW, LR "
    "schedule; loss.item()",
    "plain_pp": "DeviceMesh (pp, dp), PipelineStage + Schedule1F1B (pp micro-batches), "
    "fully_shard over dp, clip with the norm summed over pp, AdamW, LR schedule",
}


def schedule(sides: list[str], warmup: int, reps: int, block: int) -> list[tuple[str, int, int]]:
    """(side, repetition, round) per segment, in the order they run: every side's warm-up
    (repetition and round -2), round -1 (repetition -1: not counted), then `reps` repetitions
    of `block` rounds, one segment per side and round, the order rotating by one each round."""
    out = [(s, -2, -2) for s in sides]
    for i in range(-1, reps * block):
        k = i % len(sides)
        out += [(s, i // block if i >= 0 else -1, i) for s in sides[k:] + sides[:k]]
    return out


class Rep(TypedDict):
    """One side's repetition on one rank (benchmarks/workers/paired.py)."""

    gaps: list[float]  # step intervals, seconds
    odd: list[float]  # those of its odd rounds
    cpu: float  # process CPU seconds over its segments
    steps: int


Reps = list[Rep]


def paired(
    strategy: str,
    loops: list[str],
    plan: dict[str, int],
    *,
    procs: int = 2,
    layout: Sequence[str] = (),
) -> dict[str, list[Reps]]:
    """One launch of benchmarks/workers/paired.py: train_entry with `strategy` (and the parallel
    `layout` flags) and the plain `loops` in alternating segments of the same processes. Side ->
    each rank's measured repetitions."""
    d = common.scratch(f"paired-{strategy}-")
    args = [*TRAIN_ARGS, *layout]
    total = plan["warmup"] + (plan["reps"] * plan["block"] + 1) * plan["segment"]
    out = d / "paired"
    common.run(
        [
            *common.torchrun(procs),
            "-m",
            "benchmarks.workers.paired",
            "--strategy",
            strategy,
            "--run-dir",
            str(d / "run"),
            "--max-steps",
            str(total),
            *args,
        ],
        timeout=1200,
        extra_env={
            "BENCH_PAIRED": json.dumps({**plan, "out": str(out), "loops": loops}),
            "BENCH_TRAIN_ARGS": json.dumps(
                [*args, f"--strategy={strategy}", f"--train.max_steps={total}"]
            ),
        },
    )
    by_rank = [json.loads(Path(f"{out}.{r}.json").read_text()) for r in range(procs)]
    reps = [str(i) for i in range(plan["reps"])]
    return {side: [[rank[side][i] for i in reps] for rank in by_rank] for side in by_rank[0]}


def rates(got: list[Reps], part: str = "gaps") -> list[float]:
    """Steps/s per repetition: 1 / rank 0's median step interval (robust to a stall another
    process causes); part "odd": the odd rounds' alone."""
    return [1.0 / common.median(r["odd" if part == "odd" else "gaps"]) for r in got[0]]


def same_launch(got: list[Reps]) -> list[float]:
    """The side's odd rounds over all its rounds, per repetition: the A/A of one loop."""
    return [x / y for x, y in zip(rates(got, "odd"), rates(got), strict=True)]


def cpu_ms(got: list[Reps]) -> float:
    """CPU per step of all ranks (their processes, every thread), over the whole run."""
    cpu = sum(r["cpu"] for rank in got for r in rank)
    return 1000 * cpu / sum(r["steps"] for r in got[0])


def row(
    name: str,
    target: str,
    label: str,
    got: dict[str, list[Reps]],
    a: str,
    b: str,
    setup: dict[str, object],
) -> common.Row:
    ra, rb = rates(got[a]), rates(got[b])
    ca, cb = cpu_ms(got[a]), cpu_ms(got[b])
    return common.settle(
        name,
        [x / y for x, y in zip(ra, rb, strict=True)],
        target,
        **setup,
        steps_per_s_typical={a: [round(x, 3) for x in ra], b: [round(x, 3) for x in rb]},
        cpu_ms_per_step={a: round(ca, 1), b: round(cb, 1)},
        sides={a: SIDES[a], b: SIDES[b]},
        summary=f"{label}: {common.median(ra):.2f} vs {common.median(rb):.2f} steps/s (median "
        f"over repetitions of 1 / median step interval); CPU {ca:.0f} vs {cb:.0f} ms/step (all "
        "ranks). The same processes, segments alternating. Same model, data, batch, optimizer, "
        "clip; train_entry also averages the loss over ranks with its stop votes (one async "
        "all-reduce), logs each step",
    )


def run(quick: bool) -> list[common.Row]:
    reps, block, segment, warmup = (3, 2, 6, 5) if quick else (7, 4, 8, 6)
    plan = {"reps": max(3, common.reps(reps)), "block": block, "segment": segment, "warmup": warmup}
    setup: dict[str, object] = {
        "train_args": TRAIN_ARGS,
        "processes": 2,
        "backend": "gloo",
        **plan,
        "method": "one process pair, train_entry and the plain loops in alternating segments "
        "(benchmarks/workers/paired.py)",
    }
    rows = []

    # DDP against plain DDP, Accelerate and a second plain DDP (the noise row), in one launch
    ddp = {
        "training_ddp_vs_plain_ddp": (">= 0.98", "plain_ddp", "plain DDP"),
        "training_ddp_vs_accelerate": (">= 0.98", "accelerate", "Accelerate"),
    }
    noise = "training_noise_plain_ddp_twice"
    try:
        got = paired("ddp", ["plain_ddp", "accelerate", "plain_ddp_2"], plan)
        for name, (target, base, label) in ddp.items():
            rows.append(row(name, target, f"train_entry DDP vs {label}", got, TE, base, setup))
        again = [
            b / a for a, b in zip(rates(got["plain_ddp"]), rates(got["plain_ddp_2"]), strict=True)
        ]
        rows.append(
            common.noise(
                noise,
                again,
                "a second plain DDP loop (its own model copy) in the same segments: its steps/s "
                "over the first's per repetition, as the rows above read train_entry over a plain "
                "loop",
                **setup,
            )
        )
    except (common.NotMeasured, OSError, KeyError, ValueError) as e:
        rows += [common.not_measured(name, t[0], str(e)) for name, t in ddp.items()]
        rows.append(common.not_measured(noise, "-", str(e)))

    for strategy, label in (("fsdp", "FSDP2"), ("deepspeed", "DeepSpeed")):
        name, base = f"training_{strategy}_vs_plain_{strategy}", f"plain_{strategy}"
        try:
            got = paired(strategy, [base], plan)
            rows.append(
                row(name, ">= 0.98", f"train_entry {label} vs plain {label}", got, TE, base, setup)
            )
        except (common.NotMeasured, OSError, KeyError, ValueError) as e:
            rows.append(common.not_measured(name, ">= 0.98", str(e)))
    return rows
