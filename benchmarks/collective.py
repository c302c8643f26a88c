"""6. Collective bandwidth: the bus bandwidth `hpctrain doctor` reports for its all-reduce sweep, over
a bare gloo all-reduce script (benchmarks/baselines/gloo_allreduce.py, nccl-tests' method: 5 warm-up
calls, 20 timed ones, busbw = algbw * 2(n-1)/n) on the same sizes (target >= 0.95); doctor times
its sweep the same way. 9 repetitions in the full run (3 with --quick).

`hpctrain doctor --profile local --json` runs 2 gloo workers under torchrun on this machine; the
baseline runs 2 workers of its own on the sizes doctor reported. Repetitions are interleaved. The
figure compares nccl-tests' summary number, the average bus bandwidth over all sizes; for each size
the best repetition counts on both sides (a bandwidth test measures what the link can do; on a
shared machine a repetition that other jobs slowed says nothing about either side). The row is the
median of the per-repetition ratios (doctor's average over the baseline's, run back to back) with
their spread; the best-of-repetitions ratio and the per-size ratios are in the details.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import common

HPCTRAIN = str(Path(common.PY).with_name("hpctrain"))


def doctor(max_mib: int, cwd: Path) -> dict[int, float]:
    p = common.run(
        [HPCTRAIN, "doctor", "--profile", "local", "--max-mib", str(max_mib), "--json"],
        timeout=600,
        cwd=cwd,
        check_rc=False,
        extra_env={"XDG_CONFIG_HOME": str(cwd / "xdg")},
    )
    try:
        sweep = json.loads(p.stdout)["sweep"] or {}
    except (json.JSONDecodeError, KeyError) as e:
        raise common.NotMeasured(
            f"hpctrain doctor --json gave no report (exit {p.returncode}): "
            f"{(p.stdout + p.stderr)[-500:]}"
        ) from e
    if sweep.get("error") or not sweep.get("rows"):
        raise common.NotMeasured(f"doctor's sweep failed: {sweep.get('error', 'no rows')}")
    return {r["bytes"]: r["busbw_gbps"] * 1e9 for r in sweep["rows"]}


def bare(sizes: list[int], cwd: Path) -> dict[int, float]:
    out = cwd / "bare.json"
    common.run(
        [
            *common.torchrun(2),
            str(common.BASELINES / "gloo_allreduce.py"),
            "--sizes",
            ",".join(map(str, sizes)),
            "--out",
            str(out),
        ],
        timeout=600,
    )
    return {r["bytes"]: r["busbw_Bps"] for r in json.loads(out.read_text())["sizes"]}


def run(quick: bool) -> list[common.Row]:
    name, target = "collective_doctor_busbw_vs_bare_gloo", ">= 0.95"
    reps, max_mib = (3, 4) if quick else (9, 8)
    reps = common.reps(reps)
    cwd = common.scratch("coll-")
    try:
        doc_runs, bare_runs = [], []
        for _ in range(reps):
            doc_runs.append(doctor(max_mib, cwd))
            bare_runs.append(bare(sorted(doc_runs[0]), cwd))
    except common.NotMeasured as e:
        return [common.not_measured(name, target, str(e))]
    sizes = sorted(doc_runs[0])
    doc = {s: max(r[s] for r in doc_runs) for s in sizes}
    ref = {s: max(r[s] for r in bare_runs) for s in sizes}
    med_doc = sum(common.median([r[s] for r in doc_runs]) for s in sizes) / len(sizes)
    med_ref = sum(common.median([r[s] for r in bare_runs]) for s in sizes) / len(sizes)
    avg_doc, avg_ref = sum(doc.values()) / len(sizes), sum(ref.values()) / len(sizes)
    per_size = {str(s): round(doc[s] / ref[s], 3) for s in sizes}
    big = sizes[-1]
    per_rep = [
        sum(d.values()) / sum(b[s] for s in d) for d, b in zip(doc_runs, bare_runs, strict=True)
    ]
    return [
        common.settle(
            name,
            per_rep,
            target,
            best_of_reps_ratio=round(avg_doc / avg_ref, 4),
            reps=reps,
            processes=2,
            backend="gloo",
            sizes_bytes=sizes,
            busbw_GBps={
                "doctor": {str(s): doc[s] / 1e9 for s in sizes},
                "bare": {str(s): ref[s] / 1e9 for s in sizes},
            },
            per_size_ratio=per_size,
            median_reps_ratio=round(med_doc / med_ref, 4),
            estimator="best repetition per size, both sides",
            summary=f"average bus bandwidth over {len(sizes)} sizes (1 KiB-{big >> 20} MiB): doctor "
            f"{avg_doc / 1e9:.3f} GB/s, bare gloo {avg_ref / 1e9:.3f} GB/s; at {big >> 20} MiB "
            f"{doc[big] / 1e9:.3f} vs {ref[big] / 1e9:.3f} GB/s",
        )
    ]
