"""Scale: how often hpctrain asks Slurm (issue 37, flat in the number of runs).

Stand-in sacct, scontrol and scancel (tests/standins/scale/) first on PATH log every call and
answer for thousands of jobs and array elements; run folders are fabricated the way submit writes
them. Counted, as fresh `hpctrain` processes: `runs` and `status` over 10, 100 and 1,000 Slurm runs
(target: <= 2 sacct and <= 1 scontrol a command at every size), a 1,000-point sweep's `status`
(1 sacct) and `cancel` (1 scancel); and, from the poll schedule itself (hpctrain.dispatch.schedule,
what `submit --wait` and `logs --follow` follow), Slurm calls a minute after the first minute
(target <= 2: one poll, sacct + scontrol for a live job). Before this (measured on the same
stand-ins): `runs` over N runs made N sacct calls asking N(N+1)/2 ids plus one scontrol per live
run; the sweep's status 1,000 sacct, its cancel 1,000 scancel; --wait 13 + 13 calls a minute,
--follow 61 + 61.

    .venv/bin/python -c "from benchmarks import scale_slurm; print(scale_slurm.run(True))"
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from benchmarks import common
from hpctrain import dispatch

HPCTRAIN = str(Path(common.PY).with_name("hpctrain"))
STANDINS = Path(__file__).resolve().parents[1] / "tests" / "standins" / "scale"
FIRST = 1000  # the first plain job id
RUN_YAML = (
    "profile: {name: loopback, scheduler: slurm}\nrequest: {gpus: 1, name: scale, nodes: 1}\n"
)
BEFORE = {"wait": 13 + 13, "follow": 61 + 61}  # Slurm calls a minute, measured before issue 37


def _fabricate(folder: Path, job_id: str, kind: str) -> None:
    (folder / "logs").mkdir(parents=True)
    (folder / "run.yaml").write_text(RUN_YAML)
    line = {"job_id": job_id, "kind": kind, "scheduler": "slurm", "time": "2026-12-07T00:00:00Z"}
    (folder / "jobs.jsonl").write_text(json.dumps(line) + "\n")


def _counted(cmd: list[str], cwd: Path, env: dict[str, str]) -> dict[str, int]:
    """Run `hpctrain CMD` with the stand-ins; the calls it made, by tool."""
    log = Path(env["SCALE_LOG"])
    log.write_text("")
    common.run([HPCTRAIN, *cmd], timeout=600, cwd=cwd, extra_env=env)
    out = {"sacct": 0, "scontrol": 0, "scancel": 0}
    for line in log.read_text().splitlines():
        out[json.loads(line)[0]] += 1
    return out


def _env(cwd: Path) -> dict[str, str]:
    return {
        "PATH": f"{STANDINS}{os.pathsep}{os.environ['PATH']}",
        "SCALE_LOG": str(cwd / "calls.jsonl"),
        "XDG_STATE_HOME": str(cwd / "state"),
        "XDG_CONFIG_HOME": str(cwd / "xdg"),
    }


def listing_rows(quick: bool) -> list[common.Row]:
    rows = []
    for n in (10, 100) if quick else (10, 100, 1000):
        cwd = common.scratch(f"scale-slurm-{n}-")
        for i in range(n):
            _fabricate(cwd / "runs" / f"r{i:04d}", str(FIRST + i), "submit")
        env = _env(cwd) | {"SCALE_PLAIN": f"{FIRST}:{FIRST + n}"}
        for command in ("runs", "status"):
            got = _counted([command, "--json"], cwd, env)
            calls = got["sacct"] + got["scontrol"]
            rows.append(
                common.result(
                    f"scale_slurm_{command}_{n}_runs_calls",
                    calls,
                    "<= 3 (2 sacct + 1 scontrol)",
                    got["sacct"] <= 2 and got["scontrol"] <= 1,
                    runs=n,
                    calls=got,
                    before=f"{n} sacct asking {n * (n + 1) // 2} ids, + 1 scontrol per live run",
                    summary=f"`hpctrain {command}` over {n} Slurm runs: {got['sacct']} sacct, "
                    f"{got['scontrol']} scontrol",
                )
            )
    return rows


def sweep_rows() -> list[common.Row]:
    cwd = common.scratch("scale-slurm-sweep-")
    sweep = cwd / "runs" / "grid"
    entries = []
    for i in range(1000):
        name = f"{i}-lr={i}"
        _fabricate(sweep / name, f"500_{i}", "sweep")
        entries.append({"index": i, "folder": name, "values": {"lr": i}})
    (sweep / "sweep.json").write_text(json.dumps({"name": "grid", "points": entries}))
    env = _env(cwd) | {"SCALE_ARRAYS": "500:1000", "SCALE_LIVE_EVERY": "2"}
    status = _counted(["status", "grid", "--json"], cwd, env)
    cancel = _counted(["cancel", "grid"], cwd, env)
    return [
        common.result(
            "scale_slurm_sweep_1000_status_sacct_calls",
            status["sacct"],
            "<= 1",
            status["sacct"] <= 1,
            calls=status,
            before="1,000 sacct, each returning the whole array",
            summary=f"`status` of a 1,000-point sweep: {status['sacct']} sacct, "
            f"{status['scontrol']} scontrol",
        ),
        common.result(
            "scale_slurm_sweep_1000_cancel_scancel_calls",
            cancel["scancel"],
            "<= 1",
            cancel["scancel"] <= 1,
            calls=cancel,
            live_points=500,
            before="1,000 scancel (one per point)",
            summary=f"`cancel` of a 1,000-point sweep (500 live): {cancel['scancel']} scancel, "
            f"{cancel['sacct']} sacct (states before and after)",
        ),
    ]


def poll_rows() -> list[common.Row]:
    """Slurm calls a minute after the first, from the schedule over 10 minutes: each poll of a
    live job is one sacct and one scontrol (sacct's live state defers to the controller)."""
    times = dispatch.schedule(5.0, 60.0, 600.0)
    worst = max(sum(m * 60 <= t < (m + 1) * 60 for t in times) for m in range(1, 10))
    return [
        common.result(
            f"scale_slurm_{what}_calls_per_minute_after_the_first",
            2 * worst,
            "<= 2",
            2 * worst <= 2,
            polls=times,
            before=f"{BEFORE[what]} a minute",
            summary=f"`{label}`: {2 * worst} Slurm calls a minute after the first minute "
            f"(was {BEFORE[what]}); a change in the run folder's events asks at once",
        )
        for what, label in (("wait", "submit --wait"), ("follow", "logs --follow"))
    ]


def run(quick: bool) -> list[common.Row]:
    return listing_rows(quick) + sweep_rows() + poll_rows()
