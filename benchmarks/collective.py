"""6. Collective bandwidth: the bus bandwidth `hpctrain doctor`'s all-reduce sweep measures, over a
bare gloo all-reduce timed as nccl-tests times it (benchmarks/workers/allreduce.py's `bare`:
5 warm-up calls, 20 timed ones, busbw = algbw * 2(n-1)/n) on the same sizes (target >=
0.95); doctor times its sweep the same way, each size's time the slowest rank's.

Both sides in one pair of processes (benchmarks/workers/allreduce.py, 2 gloo ranks under
torchrun): doctor's per-size function (hpctrain.checks.doctor.allreduce, what `hpctrain doctor`
runs on every rank after its node checks) and the bare loop, back to back for every size of
every repetition, their order rotating. One doctor launch and one bare launch per repetition
(through 2026-12-06) read 0.947-1.102 (IQR): two launches of the same sweep, seconds apart, are
further apart than the two methods. The figure is doctor's bus bandwidth over the bare loop's
at each size, their geometric mean over the sizes per repetition; the row is the median over
repetitions with its spread. nccl-tests' summary number, the average bus bandwidth over all
sizes (stated in the details), read 0.86-1.36 per repetition on 2026-12-07: the few largest sizes
make it, each timed over 20 calls of a few milliseconds, so one descheduled call moves it; every
size counts alike in the geometric mean. collective_noise_bare_twice (stated): the bare loop run
twice in the same rotation, one over the other, read the same way.
"""

from __future__ import annotations

import json
import math

from benchmarks import common


def run(quick: bool) -> list[common.Row]:
    name, target = "collective_doctor_busbw_vs_bare_gloo", ">= 0.95"
    noise = "collective_noise_bare_twice"
    reps, max_mib = (5, 4) if quick else (15, 8)
    reps = max(3, common.reps(reps))
    out = common.scratch("coll-") / "sweep.json"
    try:
        common.run(
            [
                *common.torchrun(2),
                "-m",
                "benchmarks.workers.allreduce",
                str(out),
                str(reps),
                str(max_mib << 20),
            ],
            timeout=600,
        )
        got = json.loads(out.read_text())
    except (common.NotMeasured, OSError, ValueError) as e:
        return [common.not_measured(name, target, str(e)), common.not_measured(noise, "-", str(e))]
    sizes, bw = got["sizes"], got["busbw"]

    def avg(side: str) -> list[float]:  # the average over sizes, per repetition
        return [sum(r) / len(r) for r in bw[side]]

    def geo(a: str, b: str) -> list[float]:  # per repetition: the geometric mean over sizes of a/b
        return [
            math.exp(sum(math.log(x / y) for x, y in zip(ra, rb, strict=True)) / len(ra))
            for ra, rb in zip(bw[a], bw[b], strict=True)
        ]

    doc, ref = avg("doctor"), avg("bare")
    per_size = {
        str(s): round(
            common.median([d[i] / b[i] for d, b in zip(bw["doctor"], bw["bare"], strict=True)]),
            3,
        )
        for i, s in enumerate(sizes)
    }
    big = len(sizes) - 1
    at_big = {k: common.median([r[big] for r in bw[k]]) / 1e9 for k in ("doctor", "bare")}
    setup = {"reps": reps, "processes": 2, "backend": "gloo", "sizes_bytes": sizes}
    return [
        common.settle(
            name,
            geo("doctor", "bare"),
            target,
            **setup,
            busbw_avg_GBps={"doctor": [x / 1e9 for x in doc], "bare": [x / 1e9 for x in ref]},
            per_size_ratio=per_size,
            summary=f"doctor's bus bandwidth over the bare loop's at each of {len(sizes)} sizes "
            f"(1 KiB-{sizes[-1] >> 20} MiB), their geometric mean per repetition; one process "
            f"pair, alternating; average bus bandwidth: doctor {common.median(doc) / 1e9:.3f} GB/s, "
            f"bare gloo {common.median(ref) / 1e9:.3f} GB/s (medians over repetitions); at "
            f"{sizes[-1] >> 20} MiB {at_big['doctor']:.3f} vs {at_big['bare']:.3f} GB/s",
        ),
        common.noise(
            noise,
            geo("bare_2", "bare"),
            "the bare loop run twice in each repetition's rotation, its second run's bus "
            "bandwidth over its first's, the geometric mean over sizes (as the row above)",
            **setup,
        ),
    ]
