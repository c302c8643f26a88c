"""Run hpctrain's benchmarks: every figure a ratio against a baseline measured beside it.

    make bench                                   # everything (PLANNED_S: the seconds per group)
    make bench-quick                             # the same, fewer repetitions (for iterating)
    .venv/bin/python benchmarks/run.py --only cli --only collective --quick
    .venv/bin/python benchmarks/run.py --list

Writes benchmarks/results/<YYYY-MM-DD>-<HHMM>[-quick].json (a list of {"name", "ratio", "spread", "target",
"verdict", "meets", "details"}; each row's details name its group and the group's seconds) and
benchmarks/results/<YYYY-MM-DD>-<HHMM>[-quick].md (a Markdown table with the machine and its load, and each
group's wall time against its plan), and prints each median, its spread and the verdict (met,
missed, not settled, not measured, stated). Each benchmark runs its baseline in the same run,
repetitions interleaved: never a comparison with numbers from another run. Each group states its
noise in a row of its own (`<group>_noise_...`: the same side twice, measured as its rows measure
A against B), except preemption's (exact counts: no noise to state).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import resource
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import TypedDict

HERE = Path(__file__).resolve().parent
# Import the benchmark modules as `benchmarks.<name>`: the script's own folder must not shadow
# anything (it holds modules named like `checkpoint` and `cli`).
if sys.path and Path(sys.path[0]).resolve() == HERE:
    sys.path.pop(0)
sys.path.insert(0, str(HERE.parent))

from benchmarks import common  # noqa: E402

# name -> module; the order is the order of the report.
BENCHMARKS = {
    "training": "benchmarks.training",  # 1 steps/s vs plain DDP / FSDP2 / DeepSpeed / Accelerate
    "hf_trainer": "benchmarks.hf_trainer",  # 1 HF Trainer steps/s with our callback vs without
    "checkpoint": "benchmarks.checkpoint",  # 2 save bytes/s vs raw write+fsync, async blocking, load
    "restart": "benchmarks.restart",  # 3 time to first resumed step
    "preemption": "benchmarks.preemption",  # 4 steps redone after a signal / SIGKILL
    "cli": "benchmarks.cli",  # 5 submit --dry-run vs bare imports; 4,096-node render
    "collective": "benchmarks.collective",  # 6 doctor's all-reduce bus bandwidth vs bare gloo
    "scale": "benchmarks.scale",  # 7 Slurm calls, sockets, rendezvous, resume reads, gate, runs
    "pretrained": "benchmarks.pretrained",  # 11 hf: load on 4 ranks vs from_pretrained per rank
    "preflight": "benchmarks.preflight",  # 7 round trip, reduced check; gate, stall (live Slurm)
    "remote": "benchmarks.remote",  # 8 status/logs over SSH vs on the login node; connections
    "parallel": "benchmarks.parallel",  # 9 tp 2 / pp 2 vs plain mesh loops; the pipeline bubble
    "recovery": "benchmarks.recovery",  # 10 in-job restart vs fresh start; steps redone
    "snapshot_cost": "benchmarks.snapshot_cost",  # 10 snapshot cost per step, in one process pair
}
# Seconds each group takes in full mode on a quiet 2-core machine: the full run from a fresh clone
# of 2026-12-07 21:19 (1,814 s in all; checkpoint with its 9 repetitions since). The report shows
# each group's wall time beside it; under load a group takes longer, and its spreads show the load.
PLANNED_S = {
    "training": 410,
    "hf_trainer": 75,
    "checkpoint": 80,
    "restart": 50,
    "preemption": 40,
    "cli": 40,
    "collective": 40,
    "scale": 150,
    "pretrained": 95,
    "preflight": 170,
    "remote": 20,
    "parallel": 340,
    "recovery": 160,
    "snapshot_cost": 430,
}


class Group(TypedDict):
    """One group's run: its wall time, its plan, the load after it."""

    name: str
    rows: int
    seconds: float
    cpu_s: float  # of the harness and the processes it waited for (a lower bound, as wall_s's)
    planned_s: int | None  # full mode only
    load_after: float


class Info(TypedDict):
    """What the Markdown report says about the whole run."""

    date: str
    mode: str
    machine: dict[str, object]
    load_avg_1min: list[float]  # at the start, then after each benchmark
    wall_s: float
    cpu_s: float
    groups: list[Group]


def cpu_s() -> float:
    """CPU seconds of this process and the children it waited for, so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
    return sum(r.ru_utime + r.ru_stime for r in ru)


def run_one(name: str, quick: bool) -> list[common.Row]:
    """One benchmark module's rows; a crash of the harness itself is reported, not raised."""
    try:
        module = importlib.import_module(BENCHMARKS[name])
        rows: list[common.Row] = module.run(quick=quick)
        return rows
    except Exception as e:  # noqa: BLE001 - one broken benchmark must not lose the others
        tb = traceback.format_exc().strip().splitlines()[-6:]
        return [
            common.result(
                name, None, "-", False, not_measured=f"benchmark crashed: {e!r}", traceback=tb
            )
        ]


def fmt_ratio(row: common.Row) -> str:
    return "not measured" if row["ratio"] is None else f"{row['ratio']:g}"


def fmt_spread(row: common.Row) -> str:
    sp = row.get("spread")
    return "-" if not sp else f"{sp[0]:g}-{sp[1]:g}"


def fmt_verdict(row: common.Row) -> str:
    return row.get("verdict") or {True: "met", False: "missed", None: "stated"}[row["meets"]]


def markdown(rows: list[common.Row], info: Info) -> str:
    m, load = info["machine"], info["load_avg_1min"]
    lines = [
        f"# Benchmarks {info['date']} ({info['mode']} mode)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, Python {m['python']}. "
        f"Load average (1 min) {load[0]:.1f} at the start, {min(load):.1f}-{max(load):.1f} "
        "between benchmarks: the machine is shared, which is what the spreads show.",
        f"Wall time of the whole run: {info['wall_s']:.0f} s; CPU time of the run and the processes "
        f"it waited for: {info['cpu_s']:.0f} s (a lower bound: the Slurm and sshd jobs and the "
        "workers of the killed training sides are not counted).",
        "",
        "Each ratio is the median over repetitions of A/B within one interleaved pair; the spread is "
        'their interquartile range (the whole range below 4 repetitions). A verdict is "met" or '
        '"missed" only when the whole spread is on one side of the target, else "not settled".',
        "",
        "| benchmark | median | spread | target | verdict | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r["details"]
        note = d.get("not_measured") or d.get("summary", "")
        note = str(note).replace("|", "\\|").replace("\n", " ")
        if len(note) > 300:
            note = note[:297] + "..."
        lines.append(
            f"| {r['name']} | {fmt_ratio(r)} | {fmt_spread(r)} | {r['target']} | "
            f"{fmt_verdict(r)} | {note} |"
        )
    return "\n".join(lines + groups_table(info)) + "\n"


def groups_table(info: Info) -> list[str]:
    """Each group's wall time, its plan (full mode) and the load average after it."""
    groups = info["groups"]
    planned = sum(g["planned_s"] or 0 for g in groups)
    plan = f"; planned {planned} s on a quiet 2-core machine" if planned else ""
    lines = [
        "",
        f"Wall time per group ({info['mode']} mode{plan}):",
        "",
        "| group | rows | seconds | planned | CPU seconds | load average after |",
        "|---|---|---|---|---|---|",
    ]
    for g in groups:
        cell = "-" if g["planned_s"] is None else str(g["planned_s"])
        lines.append(
            f"| {g['name']} | {g['rows']} | {g['seconds']:.0f} | {cell} | {g['cpu_s']:.0f} | "
            f"{g['load_after']:.1f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: benchmarks/run.py --quick --only cli",
    )
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and steps")
    ap.add_argument(
        "--only",
        action="append",
        choices=list(BENCHMARKS),
        metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}",
    )
    ap.add_argument(
        "--reps",
        type=int,
        metavar="N",
        help="repetitions per benchmark (default: 2-6 by benchmark and mode)",
    )
    ap.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    ap.add_argument(
        "--keep-work",
        action="store_true",
        help="keep the run folders under benchmarks/.work (default: removed at the end)",
    )
    ap.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(f"{n} ({PLANNED_S.get(n, '?')} s planned)" for n in BENCHMARKS))
        print(f"planned in all: {sum(PLANNED_S.values())} s (full mode, quiet 2-core machine)")
        return 0

    names = args.only or list(BENCHMARKS)
    common.REPS_OVERRIDE = args.reps
    info = Info(
        date=dt.date.today().isoformat(),
        mode="quick" if args.quick else "full",
        machine=common.machine(),
        load_avg_1min=[os.getloadavg()[0]],
        wall_s=0.0,
        cpu_s=0.0,
        groups=[],
    )
    t0, started = time.perf_counter(), dt.datetime.now(dt.UTC)
    rows: list[common.Row] = []
    for name in names:
        print(f"== {name}", flush=True)
        t, cpu = time.perf_counter(), cpu_s()
        got = run_one(name, args.quick)
        seconds = time.perf_counter() - t
        for row in got:
            row["details"].setdefault("mode", info["mode"])
            row["details"]["group"], row["details"]["group_s"] = name, round(seconds, 1)
            rows.append(row)
            print(
                f"  {row['name']}: {fmt_ratio(row)} [{fmt_spread(row)}] (target "
                f"{row['target']}) {fmt_verdict(row)}",
                flush=True,
            )
            if row["details"].get("not_measured"):
                print("    " + str(row["details"]["not_measured"]).replace("\n", "\n    "))
        info["load_avg_1min"].append(os.getloadavg()[0])
        planned = None if args.quick else PLANNED_S.get(name)
        info["groups"].append(
            Group(
                name=name,
                rows=len(got),
                seconds=round(seconds, 1),
                cpu_s=round(cpu_s() - cpu, 1),
                planned_s=planned,
                load_after=info["load_avg_1min"][-1],
            )
        )
        plan = "" if planned is None else f" of {planned} s planned"
        print(
            f"  ({seconds:.0f} s{plan}, load average {info['load_avg_1min'][-1]:.1f})",
            flush=True,
        )
    info["wall_s"] = time.perf_counter() - t0
    info["cpu_s"] = cpu_s()
    for row in rows:
        row["details"].setdefault("machine", info["machine"])

    args.out.mkdir(parents=True, exist_ok=True)
    # one file pair per run: two runs in a day keep both (the start's UTC time; quick says so)
    stem = args.out / f"{info['date']}-{started:%H%M}{'-quick' if args.quick else ''}"
    stem.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(rows, info))
    if not args.keep_work:
        for path in common.SCRATCH:
            shutil.rmtree(path, ignore_errors=True)
            path.with_name(path.name + ".json").unlink(missing_ok=True)
    counts = {v: sum(fmt_verdict(r) == v for r in rows) for v in common.VERDICTS}
    print(
        f"wrote {stem}.json and {stem}.md: "
        + ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        + f"; {info['wall_s']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
