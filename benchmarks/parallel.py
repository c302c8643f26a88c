"""9. Tensor and pipeline parallel: train_entry's `--parallel.tp 2` and `--parallel.pp 2` against
plain hand-written loops doing the same, and the pipeline bubble against (p-1)/(m+p-1).

Rows (CPU, gloo; TRAIN_ARGS as benchmarks/training.py: the demo GPT, d_model 256, 4 layers, seq 64,
global batch 16 = dp x micro 8 x accum; `--strategy fsdp`, so FSDP2 shards over dp):
  - tp 2 on 2 ranks (dp 1) and on 4 ranks (dp 2 x tp 2): train_entry against
    benchmarks/baselines/loops.py's plain_tp (a ("dp", "tp") DeviceMesh, Megatron's plan with
    parallelize_module and sequence parallel, loss_parallel, fully_shard over dp);
  - pp 2 on 2 ranks (dp 1) and on 4 ranks (dp 2 x pp 2): train_entry against
    loops.py's plain_pp (a ("pp", "dp") mesh, one PipelineStage per rank, 1F1B with
    2 micro-batches per micro-step, fully_shard over dp, the clip's norm summed over pp);
  - the bubble: benchmarks/baselines/pp_bubble.py times one schedule pass over m = 2, 4, 8 micro-batches of a
    fixed size on 2 stages, fits T(m) = a + s m, and states the measured idle share 1 - s m / T(m)
    at m = 2 over the formula's 1/3 (a ratio near 1: the schedule idles as the formula says;
    above 1: fixed costs per pass, such as the point-to-point sends, add to the bubble).
Both sides of a row read the same overrides (the plain loop through benchmarks/demo.py with
train_entry's own config loader, so the batch arithmetic per dp rank is the same) and run in the
same processes, segments alternating (benchmarks/workers/paired.py, as the training rows): a
repetition is 4 rounds (2 on 4 ranks) of one 6-step segment per side. parallel_noise_same_launch
(stated): each row's plain loop, its odd rounds over all its rounds per repetition, the four
rows together.
"""

from __future__ import annotations

import json

from benchmarks import common, training
from benchmarks.training import MAX_STEPS, TRAIN_ARGS


def _row(kind: str, procs: int, plan: dict[str, int]) -> tuple[common.Row, list[float]]:
    """One row: train_entry --strategy fsdp with `kind` 2 on `procs` ranks and the plain loop,
    in alternating segments of the same processes; and the plain loop's own A/A."""
    layout = [f"--parallel.{kind}=2"]
    setup = {
        "train_args": [*TRAIN_ARGS, *layout],
        "processes": procs,
        "mesh": f"dp {procs // 2} x {kind} 2",
        "backend": "gloo",
        **plan,
        "method": "one launch, train_entry and the plain loop in alternating segments "
        "(benchmarks/workers/paired.py)",
    }
    base = f"plain_{kind}"
    got = training.paired("fsdp", [base], plan, procs=procs, layout=layout)
    label = f"train_entry {kind} 2 vs plain {kind} 2 on {procs} ranks"
    name = f"parallel_{kind}2_{procs}ranks_vs_plain"
    row = training.row(name, ">= 0.98", label, got, training.TE, base, setup)
    return row, [round(x, 4) for x in training.same_launch(got[base])]


def fit_bubble(passes: dict[int, float], p: int) -> tuple[float, dict[int, dict[str, float]]]:
    """(slot time s, per m: the pass time, the measured idle share 1 - s m / T(m) and the
    formula's (p-1)/(m+p-1)), with T(m) = a + s m fitted by least squares over the passes."""
    xs, ys = list(passes), list(passes.values())
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    s = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    rows = {
        m: {
            "pass_s": round(t, 4),
            "measured_idle": round(1 - s * m / t, 4),
            "formula": round((p - 1) / (m + p - 1), 4),
        }
        for m, t in passes.items()
    }
    return s, rows


def bubble(quick: bool) -> common.Row:
    name, target = "pipeline_bubble_vs_formula", "-"
    out = common.scratch("par-bubble-") / "bubble.json"
    ms = [2, 4, 8]
    common.run(
        [
            *common.torchrun(2),
            str(common.BASELINES / "pp_bubble.py"),
            "--passes",
            "6" if quick else "12",
            "--out",
            str(out),
            ",".join(map(str, ms)),
        ],
        timeout=900,
        extra_env={
            "BENCH_TRAIN_ARGS": json.dumps(
                [
                    *TRAIN_ARGS,
                    "--parallel.pp=2",
                    "--strategy=fsdp",
                    f"--train.max_steps={MAX_STEPS}",
                ]
            )
        },
    )
    got = json.loads(out.read_text())
    p = got["p"]
    s, rows = fit_bubble({int(m): t for m, t in got["passes"].items()}, p)
    first = rows[ms[0]]
    ratio = first["measured_idle"] / first["formula"]
    return common.result(
        name,
        ratio,
        target,
        None,
        p=p,
        schedule=got["schedule"],
        micro_batch_size=got["micro_batch_size"],
        slot_s=round(s, 5),
        by_microbatches=rows,
        summary=f"1F1B on {p} stages: measured idle share at m = {ms[0]} is "
        f"{first['measured_idle']:.3f} vs (p-1)/(m+p-1) = {first['formula']:.3f}; at m = "
        + ", ".join(f"{m}: {r['measured_idle']:.3f} vs {r['formula']:.3f}" for m, r in rows.items())
        + " (one pass timed per m, T(m) = a + s m fitted)",
    )


def run(quick: bool) -> list[common.Row]:
    # 4 processes on 2 cores take twice as long a step: 2 rounds per repetition there
    reps, segment, warmup = (3, 4, 4) if quick else (5, 6, 5)
    reps = max(3, common.reps(reps))
    rows, same = [], {}
    for kind in ("tp", "pp"):
        for procs in (2, 4):
            block = 2 if quick or procs == 4 else 4
            plan = {"reps": reps, "block": block, "segment": segment, "warmup": warmup}
            name = f"parallel_{kind}2_{procs}ranks_vs_plain"
            try:
                row, same[name] = _row(kind, procs, plan)
                rows.append(row)
            except (common.NotMeasured, OSError, KeyError, ValueError) as e:
                rows.append(common.not_measured(name, ">= 0.98", str(e)))
    noise = "parallel_noise_same_launch"
    if same:
        rows.append(
            common.noise(
                noise,
                [x for v in same.values() for x in v],
                f"each row's plain loop, its odd rounds over all its rounds per repetition "
                f"({len(same)} rows x {reps} repetitions)",
                by_row=same,
            )
        )
    else:
        rows.append(common.not_measured(noise, "-", "no row was measured"))
    try:
        rows.append(bubble(quick))
    except common.NotMeasured as e:
        rows.append(common.not_measured("pipeline_bubble_vs_formula", "-", str(e)))
    return rows
