"""1. Training overhead: steady-state steps/s of train_entry over plain loops of the same model.

train_entry (DDP, FSDP2, DeepSpeed ZeRO; 2 processes, gloo, the demo GPT) against a plain
hand-written loop of each kind (benchmarks/baselines/plain_*.py) and against Hugging Face Accelerate
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
  - the baselines: `loss.item()` of the rank's loss and one line with the completion time on rank 0
    (the progress file this harness follows);
  - train_entry: everything a run does at log_every=1: the loss averaged over ranks and the
    preemption stop votes in one all-reduce (launched without waiting, read at the next step,
    train_entry/stepsync.py), one metrics.jsonl line, one train.log line and one stdout line on
    rank 0, the checkpoint trigger check, the stall heartbeat; its DDP uses
    gradient_as_bucket_view (a train_entry default) and a bucket layout fixed at start (exact
    resume). No checkpoint is saved while measured (none is due).

Interleaved by pausing (benchmarks/interleave.py): each side is launched once and warmed up, then
the sides run in turn, the others stopped: a repetition is 4 rounds of one 8-step
segment per side. A repetition's ratio is train_entry's typical steps/s (1 / the median step
interval over its segments) over the baseline's in the same repetition; the row is the median of
those ratios with their spread, "not settled" when the spread straddles the target. One segment
of 8 steps per side per repetition (through 2026-12-06) read DDP vs plain DDP 0.881-1.050 (IQR);
the per-repetition ratio now rests on 4 segments of each side, ~4x as many intervals spread
over the repetition, their median robust to a burst of load that hits one segment.

training_noise_plain_ddp_twice (stated): plain DDP launched twice, both in the DDP rows'
interleaving, one launch over the other per repetition: the noise of this method, launch to
launch included (two launches of one configuration can differ for their whole lives). The
details also give one launch's odd rounds over its even ones (no launch difference).

Each row's details also give the CPU time per step of each side (user + system of torchrun and
both ranks, summed over the measured segments): the machine's load moves it far less than the
steps/s, so it shows whether a side does more work even when the ratio cannot settle. It is a
stated figure, not the verdict: waiting (a collective the other rank is late to) costs no CPU.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import common, interleave

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

_COMMON = (
    "demo GPT, DataLoader + DistributedSampler(shuffle, seed), forward, backward with the "
    "gradient all-reduce, clip 1.0, AdamW, LR schedule, zero_grad"
)
SIDES = {  # what each side does per optimizer step (the module's docstring has the whole list)
    "train_entry": f"{_COMMON}; one async all-reduce of [loss sum, stop votes] read at the next "
    "step; metrics.jsonl + train.log + stdout line on rank 0; heartbeat and checkpoint trigger "
    "checks; DDP: gradient_as_bucket_view, fixed bucket layout",
    "plain_ddp": f"{_COMMON}; DDP(model) with torch defaults, no_sync on non-final micro-steps; "
    "loss.item(); one progress line on rank 0",
    "accelerate": f"{_COMMON} (Accelerate's sharded loader); accelerator.prepare (DDP with torch "
    "defaults), accumulate(), accelerator.backward/clip_grad_norm_; loss.item(); one progress line",
    "plain_fsdp": f"{_COMMON}; fully_shard per block then the root; set_requires_gradient_sync; "
    "loss.item(); one progress line",
    "plain_deepspeed": f"{_COMMON}; deepspeed.initialize (ZeRO-2, torch AdamW client optimizer, "
    "gradient_clipping 1.0), engine.backward/step; loss.item(); one progress line",
}


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(*pids: int) -> float:
    """User + system CPU seconds of these processes (0 for those gone)."""
    total = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / _TICK


@dataclass
class Side(interleave.Side):
    """A side that also counts the CPU time its processes (torchrun and both ranks) spend inside
    the measured segments: a figure the machine's load barely moves, unlike steps/s. Summed
    over every segment, a step cut by a pause is counted once (its parts fall in two segments)."""

    cpu_s: float = 0.0
    steps: int = 0
    _since: tuple[float, int] | None = None

    def signal(self, sig: int) -> None:
        if sig == signal.SIGSTOP and self._since is not None and self.proc is not None:
            super().signal(sig)
            time.sleep(0.02)  # let the stop land
            cpu0, steps0 = self._since
            self.cpu_s += _cpu_s(*self.tree) - cpu0
            self.steps += self.poll() - steps0
            self._since = None
            return
        super().signal(sig)
        if sig == signal.SIGCONT and self.proc is not None and self.proc.poll() is None:
            self._since = (_cpu_s(*self.tree), self.poll())

    def cpu_ms_per_step(self) -> float | None:
        return 1000 * self.cpu_s / self.steps if self.steps else None


def train_entry_side(strategy: str) -> Side:
    d = common.scratch(f"train-{strategy}-")
    return Side(
        name="train_entry",
        progress=d / "metrics.jsonl",
        log=d / "torchrun.log",
        cmd=[
            *common.torchrun(2),
            "-m",
            "train_entry",
            "--strategy",
            strategy,
            "--run-dir",
            str(d),
            "--max-steps",
            str(MAX_STEPS),
            *TRAIN_ARGS,
        ],
    )


def baseline_side(name: str, script: str) -> Side:
    d = common.scratch(f"base-{name}-")
    return Side(
        name=name,
        progress=d / "progress.txt",
        log=d / "out.log",
        cmd=[
            *common.torchrun(2),
            str(common.BASELINES / script),
            "--max-steps",
            str(MAX_STEPS),
            "--out",
            str(d / "steps.json"),
        ],
        env={
            "BENCH_TRAIN_ARGS": json.dumps([*TRAIN_ARGS, f"--train.max_steps={MAX_STEPS}"]),
            "BENCH_PROGRESS": str(d / "progress.txt"),
        },
    )


def row(
    name: str,
    target: str,
    label: str,
    got: interleave.Measured,
    sides: list[Side],
    a: str,
    b: str,
    setup: dict[str, object],
) -> common.Row:
    ra, rb = got.rates(a), got.rates(b)
    cpu = {s.name: s.cpu_ms_per_step() for s in sides if s.name in (a, b)}
    ca, cb = cpu.get(a), cpu.get(b)
    cpu_text = f"; CPU {ca:.0f} vs {cb:.0f} ms/step (both ranks)" if ca and cb else ""
    return common.settle(
        name,
        got.ratios(a, b),
        target,
        **setup,
        steps_per_s_typical={a: ra, b: rb},
        cpu_ms_per_step=cpu,
        cpu_ratio_b_over_a=round(cb / ca, 4) if ca and cb else None,
        sides={a: SIDES[a], b: SIDES[b]},
        summary=f"{label}: {common.median(ra):.2f} vs {common.median(rb):.2f} steps/s (median "
        f"over repetitions of 1 / median step interval){cpu_text}. Same model, data, batch, "
        "optimizer, clip; train_entry also averages the loss over ranks with its stop votes "
        "(one async all-reduce), logs each step",
    )


def noise_row(got: interleave.Measured, setup: dict[str, object]) -> common.Row:
    again = got.ratios("plain_ddp_2", "plain_ddp")
    return common.noise(
        "training_noise_plain_ddp_twice",
        again,
        "plain DDP launched twice, both in the DDP rows' interleaving: the second launch over "
        "the first per repetition, as the rows above read train_entry over a baseline",
        same_launch_per_rep=[round(x, 4) for x in got.same_launch("plain_ddp")],
        **setup,
    )


def run(quick: bool) -> list[common.Row]:
    reps, block, segment, warmup = (3, 2, 6, 5) if quick else (5, 4, 8, 6)
    reps = max(3, common.reps(reps))
    setup = {
        "train_args": TRAIN_ARGS,
        "processes": 2,
        "backend": "gloo",
        "reps": reps,
        "rounds_per_rep": block,
        "segment_steps": segment,
        "warmup_steps_skipped": warmup,
        "method": "one launch per side, interleaved segments (SIGSTOP/SIGCONT)",
    }
    rows = []

    # DDP, plain DDP (launched twice: the noise row) and Accelerate interleaved: the train_entry
    # segments serve both ratios.
    ddp = {
        "training_ddp_vs_plain_ddp": (">= 0.98", "plain_ddp", "plain DDP"),
        "training_ddp_vs_accelerate": (">= 1.0", "accelerate", "Accelerate"),
    }
    try:
        sides = [
            train_entry_side("ddp"),
            baseline_side("plain_ddp", "plain_ddp.py"),
            baseline_side("accelerate", "accelerate_loop.py"),
            baseline_side("plain_ddp_2", "plain_ddp.py"),
        ]
        got = interleave.run(list(sides), warmup=warmup, segment=segment, reps=reps, block=block)
        for name, (target, base, label) in ddp.items():
            label = f"train_entry DDP vs {label}"
            rows.append(row(name, target, label, got, sides, "train_entry", base, setup))
        noise = noise_row(got, setup)
    except common.NotMeasured as e:
        rows += [common.not_measured(name, t[0], str(e)) for name, t in ddp.items()]
        noise = common.not_measured("training_noise_plain_ddp_twice", "-", str(e))

    for strategy, script, label in (
        ("fsdp", "plain_fsdp.py", "FSDP2"),
        ("deepspeed", "plain_deepspeed.py", "DeepSpeed"),
    ):
        name, base = f"training_{strategy}_vs_plain_{strategy}", f"plain_{strategy}"
        try:
            sides = [train_entry_side(strategy), baseline_side(base, script)]
            got = interleave.run(
                list(sides), warmup=warmup, segment=segment, reps=reps, block=block
            )
            rows.append(
                row(
                    name,
                    ">= 0.98",
                    f"train_entry {label} vs plain {label}",
                    got,
                    sides,
                    "train_entry",
                    base,
                    setup,
                )
            )
        except common.NotMeasured as e:
            rows.append(common.not_measured(name, ">= 0.98", str(e)))
    return [*rows, noise]
