"""Scale of the run-folder readers (issue 37): `hpctrain runs` over 1,000 / 10,000 run folders
(--quick: 100 / 1,000), and `hpctrain report` over a metrics.jsonl of 10^4 / 10^5 / 10^6 lines.

Runs: one real local run (`hpctrain submit --profile local --wait`, 2 steps, as benchmarks/scale.py
makes it) copied (hard links) into N run folders; the figure is the child's CPU seconds (user +
sys) of `hpctrain runs --runs-dir DIR --json` and of the table (`hpctrain runs`), median of the
repetitions, and the growth exponent between the two sizes (1.0: linear; start-up makes it
less). Budget: <= 3 s at 10,000 runs. scale_noise_runs_cpu_twice (stated): the table's CPU
seconds at the largest size, each repetition's over the one before it.

Report: a run folder whose metrics.jsonl has N lines as train_entry writes them; the figure is
the peak resident memory (ru_maxrss) of `hpctrain report RUN` as a child (plots included).
Budget: <= 300 MB at 10^6 lines (one dict per line held 1.6 GB).

  .venv/bin/python -c "from benchmarks import scale_runs as s; print(s.run(quick=False))"
  (quick=True: 100 and 1,000 runs, 10^4 and 10^5 lines; benchmarks/run.py runs it in "scale")
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import sys
import time
from pathlib import Path

from benchmarks import common
from hpctrain.kernel import jobenv

HPCTRAIN = str(Path(common.PY).with_name("hpctrain"))


def cpu_and_wall(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """The child's CPU seconds (user + sys: a shared machine's load does not inflate them as it
    does wall time) and its wall seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    common.run(cmd, timeout=300, cwd=cwd, extra_env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


RUN_SIZES = (100, 1000, 10000)
LINE_SIZES = (10**4, 10**5, 10**6)
RUNS_TARGET, REPORT_TARGET = "<= 3.0", "<= 300"
_MAXRSS = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, "
    "stdout=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def _env(cwd: Path) -> dict[str, str]:
    return {
        "XDG_CONFIG_HOME": str(cwd / "xdg"),
        "XDG_CACHE_HOME": str(cwd / "cache"),
        "XDG_STATE_HOME": str(cwd / "state"),
        "MPLBACKEND": "Agg",
        jobenv.SITE_PATH: "",
    }


def real_run(cwd: Path) -> Path:
    """One finished local run, as `submit --wait` leaves it (its folder)."""
    common.run(
        [HPCTRAIN, "submit", "--profile", "local", "--nodes", "1", "--gpus", "1"]
        + ["--name", "r0", "--wait", "--", "--max-steps", "2", "--model.d_model=16"]
        + ["--model.n_layers=1", "--model.n_heads=2"],
        timeout=300,
        cwd=cwd,
        extra_env=_env(cwd),
    )
    return cwd / "runs" / "r0"


def fabricate(real: Path, where: Path, n: int) -> Path:
    """`n` copies of a run folder (hard links: the same bytes, made in a fraction of a copy's
    time) in `where`."""
    where.mkdir(parents=True)
    for i in range(n):
        shutil.copytree(real, where / f"r{i:05d}", symlinks=True, copy_function=os.link)
    return where


def runs_rows(quick: bool) -> list[common.Row]:
    sizes = RUN_SIZES[:2] if quick else RUN_SIZES[1:]
    reps = common.reps(3)
    cwd = common.scratch("scale-runs-many-")
    real = real_run(cwd)
    cpu: dict[int, dict[str, list[float]]] = {}
    for n in sizes:
        folder = fabricate(real, cwd / f"n{n}", n)
        cpu[n] = {"json": [], "table": []}
        for _ in range(reps):
            for kind, extra in (("json", ["--json"]), ("table", [])):
                c, _ = cpu_and_wall(
                    [HPCTRAIN, "runs", "--runs-dir", str(folder), *extra], cwd, _env(cwd)
                )
                cpu[n][kind].append(c)
        shutil.rmtree(folder)
    top, below = sizes[-1], sizes[-2]
    med = {n: {k: common.median(v) for k, v in kinds.items()} for n, kinds in cpu.items()}
    growth = {
        k: math.log(med[top][k] / med[below][k]) / math.log(top / below) for k in ("json", "table")
    }
    per_size = {str(n): {k: round(v, 3) for k, v in m.items()} for n, m in med.items()}
    summary = (
        f"`hpctrain runs` over {top} local runs: {med[top]['table']:.2f} s CPU (table), "
        f"{med[top]['json']:.2f} s (--json); growth exponent {below}->{top}: "
        f"{growth['table']:.2f} (table), {growth['json']:.2f} (--json)"
    )
    return [
        common.settle(
            f"scale_runs_{top}_runs_cpu_seconds",
            cpu[top]["table"],
            RUNS_TARGET if top == RUN_SIZES[-1] else "-",
            runs=top,
            reps=reps,
            cpu_by_size=per_size,
            growth_exponent=round(growth["table"], 3),
            growth_exponent_json=round(growth["json"], 3),
            summary=summary,
        ),
        common.noise(
            "scale_noise_runs_cpu_twice",
            common.successive(cpu[top]["table"]),
            f"`hpctrain runs` over {top} runs, its CPU seconds, each repetition's over the one "
            "before it",
        ),
        common.result(
            "scale_runs_cpu_growth_exponent",
            growth["table"],
            "-",
            None,
            sizes=[below, top],
            summary=f"CPU(runs) ~ N^{growth['table']:.2f} between {below} and {top} runs",
        ),
    ]


def metrics_run(root: Path, lines: int) -> Path:
    """A run folder with `lines` metric lines as train_entry writes them."""
    run = root / "runs" / f"m{lines}"
    (run / "logs").mkdir(parents=True)
    (run / "run.yaml").write_text(
        "profile:\n  name: local\n  scheduler: local\nrequest:\n  gpus: 1\n  nodes: 1\n"
    )
    with (run / "metrics.jsonl").open("w") as f:
        for step in range(1, lines + 1):
            row = {
                "step": step,
                "loss": 3.0 - step * 1e-6,
                "samples_per_s": 1000.0 + step % 7,
                "step_time_s": 0.05,
                "max_steps": lines,
                "time": 1.8e9 + step * 0.05,
                "mem_peak_gib": [1.25, 1.5],
            }
            f.write(json.dumps(row) + "\n")
    return run


def report_rows(quick: bool) -> list[common.Row]:
    sizes = LINE_SIZES[:2] if quick else LINE_SIZES
    cwd = common.scratch("scale-report-")
    peak_mb: dict[int, float] = {}
    for n in sizes:
        run = metrics_run(cwd, n)
        p = common.run(
            [sys.executable, "-c", _MAXRSS, HPCTRAIN, "report", str(run)],
            timeout=600,
            cwd=cwd,
            extra_env=_env(cwd),
        )
        peak_mb[n] = int(p.stdout.split()[-1]) / 1024  # ru_maxrss is KiB on Linux
        shutil.rmtree(run)
    top = sizes[-1]
    per_line = (peak_mb[top] - peak_mb[sizes[0]]) * 2**20 / (top - sizes[0])
    target = REPORT_TARGET if top == LINE_SIZES[-1] else "-"
    return [
        common.result(
            f"scale_report_{top}_lines_peak_mb",
            peak_mb[top],
            target,
            common.check(peak_mb[top], target) if target != "-" else None,
            lines=top,
            peak_mb_by_size={str(n): round(v, 1) for n, v in peak_mb.items()},
            bytes_per_line=round(per_line, 1),
            summary=f"`hpctrain report` of {top} metric lines (plots included): peak "
            f"{peak_mb[top]:.0f} MB; {per_line:.0f} bytes a line above {sizes[0]} lines",
        )
    ]


def run(quick: bool) -> list[common.Row]:
    rows: list[common.Row] = []
    try:
        rows += runs_rows(quick)
    except common.NotMeasured as e:
        rows += [common.not_measured("scale_runs_10000_runs_cpu_seconds", RUNS_TARGET, str(e))]
    try:
        rows += report_rows(quick)
    except common.NotMeasured as e:
        rows += [common.not_measured("scale_report_1000000_lines_peak_mb", REPORT_TARGET, str(e))]
    return rows
