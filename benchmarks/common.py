"""Shared pieces of the benchmark harness: results, timing, launching torchrun, the machine.

Every benchmark returns a list of `result(...)` dicts. A figure is always a ratio against a baseline
measured in the same run (repetitions interleaved, medians taken); a piece that cannot be measured
reports `not_measured(...)` with the reason instead of a number. Each group also states its noise
in one A/A row (`noise`): the same side twice, measured as its rows measure A against B.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

from hpctrain.kernel import jobenv, jobkey

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
BASELINES = BENCH / "baselines"
PY = sys.executable


REPS_OVERRIDE: int | None = None  # run.py --reps: the same number of repetitions everywhere


def reps(default: int) -> int:
    return REPS_OVERRIDE or default


class NotMeasured(Exception):
    """A piece under measurement is missing or failed; the message says why."""


VERDICTS = ("met", "missed", "not settled", "not measured", "stated")


class Row(TypedDict):
    """One row of the results file (run.py writes a list of them as JSON)."""

    name: str
    ratio: float | None
    target: str
    meets: bool | None
    spread: list[float] | None
    verdict: str
    details: dict[str, object]


def result(
    name: str,
    ratio: float | None,
    target: str,
    meets: bool | None,
    *,
    spread: tuple[float, float] | None = None,
    verdict: str | None = None,
    **details: object,
) -> Row:
    """One row of the results file. `target` is text such as ">= 0.98"; `meets` is None for
    figures that have no target (stated as measured) and for a ratio whose spread straddles its
    target ("not settled"). `spread` is (low, high) of the repetitions (see `settle`)."""
    if ratio is not None:
        ratio = round(float(ratio), 4)
    if verdict is None:
        verdict = (
            "not measured"
            if ratio is None
            else "stated"
            if meets is None
            else "met"
            if meets
            else "missed"
        )
    assert verdict in VERDICTS, verdict
    return {
        "name": name,
        "ratio": ratio,
        "target": target,
        "meets": meets,
        "spread": None if spread is None else [round(float(x), 4) for x in spread],
        "verdict": verdict,
        "details": details,
    }


def spread_of(values: list[float]) -> tuple[float, float]:
    """The spread of repetitions: the interquartile range (25th-75th percentile, inclusive
    method) with 4 or more values, else the whole range."""
    v = sorted(values)
    if len(v) >= 4:
        q = statistics.quantiles(v, n=4, method="inclusive")
        return q[0], q[2]
    return v[0], v[-1]


def settle(name: str, per_rep: list[float], target: str, **details: object) -> Row:
    """A row from per-repetition figures (each A/B ratio from one interleaved pair): the median,
    its spread, and a verdict: "met" / "missed" only when the whole spread is on one side of the
    target, else "not settled" (never met or missed by noise). Target "-": stated, no verdict."""
    if not per_rep:
        return not_measured(name, target, "no repetitions")
    med, (lo, hi) = median(per_rep), spread_of(per_rep)
    rounded = [round(x, 4) for x in per_rep]
    meets: bool | None
    if target == "-":
        verdict, meets = "stated", None
    elif check(lo, target) and check(hi, target):
        verdict, meets = "met", True
    elif not check(lo, target) and not check(hi, target):
        verdict, meets = "missed", False
    else:
        verdict, meets = "not settled", None
    return result(
        name,
        med,
        target,
        meets,
        spread=(lo, hi),
        verdict=verdict,
        per_rep=rounded,
        **details,
    )


def noise(name: str, per_rep: list[float], what: str, **details: object) -> Row:
    """A group's A/A row: the same side measured twice the way the group's rows measure A against
    B (`what` says how); stated, no target. Its spread is the noise the group's verdicts are read
    against: a row nearer its target than that settles by luck, either way."""
    return settle(name, per_rep, "-", summary=what, **details)


def successive(values: Sequence[float]) -> list[float]:
    """Each value over the one before it: the A/A of a side measured once per repetition, its two
    sides one repetition apart (further apart than A and B in one: an upper bound)."""
    return [b / a for a, b in zip(values, values[1:], strict=False)]


def check(ratio: float, target: str) -> bool:
    """Does `ratio` meet a target written as ">= x", "<= x", "< x" or "== x"?"""
    op, value = target.split()
    bound = float(value)
    return {">=": ratio >= bound, "<=": ratio <= bound, "<": ratio < bound, "==": ratio == bound}[
        op
    ]


def measured(name: str, ratio: float, target: str, **details: object) -> Row:
    """A figure that is exact, not noisy (a count, a worst case): met or missed as it stands."""
    return result(name, ratio, target, check(ratio, target), spread=None, verdict=None, **details)


def not_measured(name: str, target: str, reason: str) -> Row:
    return result(name, None, target, False, not_measured=reason)


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(*pids: int) -> float:
    """User + system CPU seconds of these processes (0 for those gone)."""
    total = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / _TICK


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def env(**extra: str) -> dict[str, str]:
    """The environment every child gets: one thread per process (2 shared cores), DeepSpeed on
    CPU with no C++ builds, the checkout importable."""
    e = dict(os.environ)
    e.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        DS_ACCELERATOR="cpu",
        DS_BUILD_OPS="0",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    # A run launched by a benchmark must not inherit the caller's run folder or stop flag.
    for k in (*jobenv.RUN_SCOPED, jobenv.RESTART_COUNT):
        e.pop(k, None)
    e[jobenv.JOB_KEY] = jobkey.fresh()  # what the batch script exports: snapshots need it
    e.update(extra)
    return e


def run(
    cmd: list[str],
    *,
    timeout: float,
    cwd: Path | None = None,
    check_rc: bool = True,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output; a failure becomes NotMeasured with the output's tail."""
    try:
        p = subprocess.run(
            cmd,
            cwd=cwd or ROOT,
            env=env(**(extra_env or {})),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        raise NotMeasured(f"timed out after {timeout:.0f} s: {' '.join(map(str, cmd))}") from e
    if check_rc and p.returncode != 0:
        tail = (p.stdout + p.stderr).strip().splitlines()[-15:]
        raise NotMeasured(f"exit {p.returncode}: {' '.join(map(str, cmd))}\n" + "\n".join(tail))
    return p


def torchrun(nproc: int = 2) -> list[str]:
    """torchrun on this machine: --standalone picks a free port (never a fixed 29500)."""
    return [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]


def read_jsonl(path: Path) -> list[dict[str, Any]]:  # Any: whatever json.loads read
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by SIGKILL
                pass
    return rows


SCRATCH: list[Path] = []  # every folder scratch() made in this run; run.py removes them at the end


def scratch(prefix: str) -> Path:
    """A fresh folder on the same disk as the checkout (benchmarks/.work is git-ignored)."""
    base = BENCH / ".work"
    base.mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    SCRATCH.append(path)
    return path


def machine() -> dict[str, object]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch  # the harness process may import torch; only the CLI paths must not

        torch_version = str(torch.__version__)
    except ImportError:
        torch_version = "not installed"
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch_version,
        "python": platform.python_version(),
        "os": platform.platform(),
        "load_avg_1min_at_start": load,
    }


def launch(
    cmd: list[str], log: Path, extra_env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a command in the background (its own session), output to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env(**(extra_env or {})),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts its workers in sessions of their own, so a
    process-group kill would miss them)."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Send `sig` to a process we started and to everything below it, all at once."""
    for pid in [*descendants(proc.pid), proc.pid]:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class Follow:
    """The step of the newest row of a metrics.jsonl, reading only what was appended since the
    last look (re-reading the whole file at every look costs the run being watched CPU, more as
    the file grows)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.step = path, 0, -1

    def __call__(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return self.step
        end = chunk.rfind(b"\n") + 1  # complete lines only
        self.offset += end
        for line in chunk[:end].splitlines():
            try:
                self.step = int(json.loads(line).get("step", self.step))
            except (ValueError, AttributeError):  # not a JSON object
                pass
        return self.step


def wait_for_step(
    metrics: Path,
    step: int,
    proc: subprocess.Popen[bytes],
    timeout: float,
    follow: Follow | None = None,
) -> int:
    """Poll metrics.jsonl until a row with step >= `step` appears; returns that step. NotMeasured
    if the run ends or the time runs out first. `follow`: carried over from an earlier call."""
    follow = follow or Follow(metrics)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (got := follow()) >= step:
            return got
        if proc.poll() is not None:
            raise NotMeasured(f"the run exited ({proc.returncode}) before step {step}")
        time.sleep(0.05)
    kill_tree(proc, 9)
    raise NotMeasured(f"step {step} not reached in {timeout:.0f} s")
