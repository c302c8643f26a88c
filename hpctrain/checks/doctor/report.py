"""The doctor's report: each failure's likely cause and fix (after the guides' NCCL troubleshooting
table: timeouts, P2P, wrong interface, small /dev/shm in containers), and the collective sweep."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypedDict

from hpctrain.checks.doctor.checks import WRONG_IFACE, Check, NodeReport
from hpctrain.kernel.files import write_atomic

# --- the sweep's causes, and the report ---------------------------------------------------------

SWEEP_FAILURE = {
    "timeout": (
        "collective timed out: a firewall, the wrong interface, or GPU P2P trouble",
        "check the interface checks above; try NCCL_P2P_DISABLE=1 (network.env) and "
        "NCCL_DEBUG=INFO; raise the process-group timeout only once the cause is known",
    ),
    "address": (WRONG_IFACE, "set network.socket_ifname / gloo_socket_ifname to a real interface"),
    "shm": (
        "small shared memory (NCCL SHM transport)",
        "--shm-size=16g or --ipc=host for the container",
    ),
    "other": ("the collective failed", "read the node logs (NCCL_DEBUG=INFO adds detail)"),
}


def classify(error: str) -> str:
    e = error.lower()
    if "timed out" in e or "timeout" in e:
        return "timeout"
    if "unable to find address" in e or "ifname" in e or "no such device" in e:
        return "address"
    if "shm" in e or "bus error" in e:
        return "shm"
    return "other"


def sweep_sizes(max_bytes: int, min_bytes: int = 1024) -> list[int]:
    sizes, n = [], min_bytes
    while n <= max_bytes:
        sizes.append(n)
        n *= 2
    return sizes


class SweepRow(TypedDict):
    """One size of the all-reduce sweep, as nccl-tests reports it."""

    bytes: int
    count: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    correct: bool


class Sweep(TypedDict, total=False):
    """The sweep (the workers' sweep.json), or why it did not run (`skipped`) or failed (`error`)."""

    backend: str | None
    world: int
    dtype: str
    rows: list[SweepRow]
    error: str
    skipped: str


@dataclass
class Report:
    profile: str
    scheduler: str
    nodes: int
    gpus: int
    job_id: str | None = None
    run_dir: str | None = None
    node_reports: list[NodeReport] = field(default_factory=list)
    sweep: Sweep | None = None
    problems: list[Check] = field(default_factory=list)  # job-level failures (no node report, ...)

    @property
    def checks(self) -> list[Check]:
        out = [c for r in self.node_reports for c in r.checks] + list(self.problems)
        if self.sweep is not None:
            out.append(sweep_check(self.sweep))
        return out

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.checks)

    def to_dict(self) -> dict[str, object]:
        return {
            "profile": self.profile,
            "scheduler": self.scheduler,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "job_id": self.job_id,
            "run_dir": self.run_dir,
            "ok": self.ok,
            "node_reports": [r.to_dict() for r in self.node_reports],
            "problems": [asdict(c) for c in self.problems],
            "sweep": self.sweep,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def write_report(path: Path, data: Mapping[str, object]) -> None:
    """A file of the workers' report (node-<n>.json, sweep.json), written atomically."""
    write_atomic(path, json.dumps(data, indent=2), durable=False)


def sweep_check(sweep: Sweep) -> Check:
    if error := sweep.get("error"):
        cause, fix = SWEEP_FAILURE[classify(error)]
        return Check("all-reduce", "fail", error[:500], cause, fix)
    if skipped := sweep.get("skipped"):
        return Check("all-reduce", "skip", skipped)
    rows = sweep.get("rows") or []
    bad = [r for r in rows if not r.get("correct", False)]
    if not rows or bad:
        return Check(
            "all-reduce",
            "fail",
            f"{len(bad)} of {len(rows)} sizes gave a wrong sum",
            "data corruption in the transport (P2P)",
            "try NCCL_P2P_DISABLE=1 and report it",
        )
    peak = max(r["busbw_gbps"] for r in rows)
    return Check(
        "all-reduce",
        "pass",
        f"{sweep['backend']} over {sweep['world']} ranks, "
        f"{len(rows)} sizes up to {_size(rows[-1]['bytes'])}, peak bus bandwidth {peak:.2f} GB/s",
    )


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n} {unit}"
        n //= 1024
    return f"{n} GiB"


def format_report(rep: Report) -> str:
    lines = [
        f"hpctrain doctor: profile {rep.profile} ({rep.scheduler}), {rep.nodes} node(s) x "
        f"{rep.gpus} worker(s)" + (f", job {rep.job_id}" if rep.job_id else "")
    ]
    if rep.run_dir:
        lines.append(f"  run folder: {rep.run_dir}")

    def emit(c: Check) -> None:
        lines.append(f"  {c.status.upper():4} {c.name:16} {c.detail}")
        if c.status in ("fail", "warn") and c.cause:
            lines.append(f"       likely cause: {c.cause}")
        if c.status in ("fail", "warn") and c.fix:
            lines.append(f"       fix: {c.fix}")

    for r in rep.node_reports:
        lines.append(f"node {r.node} ({r.host}):")
        for c in r.checks:
            emit(c)
    if rep.problems:
        lines.append("job:")
        for c in rep.problems:
            emit(c)
    if rep.sweep is not None:
        s = rep.sweep
        backend = f"{s['backend']}, " if s.get("backend") not in (None, "?") else ""
        lines.append(
            f"all-reduce sweep ({backend}{s.get('world', '?')} ranks, "
            f"{s.get('dtype', 'float32')}, sum; busbw = algbw * 2(n-1)/n as nccl-tests):"
        )
        if s.get("rows"):
            lines.append(
                f"  {'size':>10} {'count':>11} {'time(us)':>11} {'algbw(GB/s)':>12} "
                f"{'busbw(GB/s)':>12}  ok"
            )
            for row in s["rows"]:
                lines.append(
                    f"  {_size(row['bytes']):>10} {row['count']:>11} {row['time_us']:>11.1f} "
                    f"{row['algbw_gbps']:>12.3f} {row['busbw_gbps']:>12.3f}  "
                    f"{'yes' if row['correct'] else 'NO'}"
                )
        emit(sweep_check(s))
    failed = [c for c in rep.checks if c.failed]
    lines.append(
        "all checks passed"
        if not failed
        else f"{len(failed)} check(s) failed: " + ", ".join(sorted({c.name for c in failed}))
    )
    return "\n".join(lines)
