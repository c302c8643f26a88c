"""The preflight verdict, run by the batch shell once every node's checks are in (no torch).

    python -m hpctrain.checks.preflight.gate DIR --nodes n1,n2 --min-nodes 1 --on-fail shrink ...

A node fails when it left no report within the budget, its checks could not run (the node command
wrote `fail-<id>.txt`: exit code and the last lines of stderr), one of its checks failed, its
matmul is more than `slow_factor` times the median of the other nodes, or every ring pair it is in
is more than `slow_factor` times slower than the median of the pairs without it. The
all-reduce of all healthy nodes
is compared with the profile's `expected_busbw_gbps`; with two nodes a slow link cannot be pinned
on either, so it is reported, not excluded (`hpctrain doctor --bisect` narrows it down).

Hot spares (`--train`, `--spare-nodes`): the verdict `swap` first (spares.py).

Prints shell assignments for the batch shell (`eval`): hpctrain_gate=ok|swap|shrink|requeue|fail,
hpctrain_good, hpctrain_bad (comma-separated Slurm names), hpctrain_exclude (what the requeued job
excludes), hpctrain_gate_reason, hpctrain_train (the nodes to train on) and
hpctrain_spares_left. Writes verdict.json and the run's preflight.json; when a node failed (or a
warning was raised), also one `preflight` event in events.jsonl naming each failed node with its
reason.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from hpctrain.checks.preflight import (
    LATEST,
    NET_ERROR,
    NET_REPORT,
    NODE_FAILURE,
    NODE_REPORT,
    VERDICT,
    NetError,
    NetJson,
    NodeJson,
    spares,
)
from hpctrain.checks.preflight.poll import read_own
from hpctrain.checks.preflight.spares import place
from hpctrain.kernel.files import write_atomic
from hpctrain.kernel.rundir import RunFolder

NO_REPORT = "no report within"


@dataclass
class Verdict:
    action: str  # ok | swap | shrink | requeue | fail
    good: list[str]
    bad: dict[str, str]  # node name -> reason
    warnings: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    update: list[str] = field(default_factory=list)  # `scontrol update JobId=..` for a requeue
    reason: str = ""
    busbw_gbps: float | None = None
    seconds: float | None = None
    train: list[str] = field(default_factory=list)  # the nodes to train on (hot spares)
    spares_left: list[str] = field(default_factory=list)
    swapped: list[tuple[str, str]] = field(default_factory=list)  # (node out, spare in)

    def shell(self) -> str:
        values = {
            "hpctrain_gate": self.action,
            "hpctrain_good": ",".join(self.good),
            "hpctrain_bad": ",".join(self.bad),
            "hpctrain_exclude": ",".join(self.exclude),
            "hpctrain_gate_reason": self.reason,
            "hpctrain_train": ",".join(self.train),
            "hpctrain_spares_left": ",".join(self.spares_left),
        }
        lines = [f"{k}={shlex.quote(v)}" for k, v in values.items()]
        lines.append(f"hpctrain_update=({' '.join(shlex.quote(u) for u in self.update)})")
        return "\n".join(lines) + "\n"


def read(
    folder: Path, names: list[str]
) -> tuple[dict[int, NodeJson], dict[int, str], NetJson | None, list[NetError]]:
    """The node reports, the nodes whose checks could not run (why), the all-reduce's report and
    its errors. One listing, not a stat per node; only this account's files (poll.read_own)."""
    present = set(os.listdir(folder)) if folder.is_dir() else set()

    def own(name: str) -> bytes | None:
        return read_own(folder / name) if name in present else None

    reports: dict[int, NodeJson] = {}
    failures: dict[int, str] = {}  # node -> why its checks could not run
    for n in range(len(names)):
        try:
            if (data := own(NODE_REPORT.format(node=n))) is not None:
                reports[n] = json.loads(data)
                continue
        except ValueError:
            pass
        if (data := own(NODE_FAILURE.format(node=n))) is not None:
            lines = [ln.strip() for ln in data.decode(errors="replace").splitlines() if ln.strip()]
            code = lines[0] if lines else "?"
            tail = " | ".join(lines[1:])[-400:] or "no output"
            failures[n] = f"the preflight checks could not run (exit code {code}): {tail}"
    net: NetJson | None = json.loads(data) if (data := own(NET_REPORT)) else None
    pattern = NET_ERROR.format(node="*")
    errors: list[NetError] = [
        json.loads(r) for f in sorted(present) if fnmatch(f, pattern) and (r := own(f))
    ]
    return reports, failures, net, errors


def judge(
    folder: Path,
    names: list[str],
    *,
    budget_s: float,
    slow_factor: float,
    expected_busbw: float | None,
    min_fraction: float,
) -> tuple[list[str], dict[str, str], list[str], float | None]:
    """(good, bad {name: reason}, warnings, busbw of all good nodes)."""
    reports, failures, net, errors = read(folder, names)
    bad: dict[str, str] = {}
    warnings: list[str] = []
    for n, name in enumerate(names):
        if n in failures:
            bad[name] = failures[n]
        elif n not in reports:
            bad[name] = (
                f"{NO_REPORT} the {budget_s:g} s budget (the node hung, or its task never started)"
            )
        else:
            failed = [c for c in reports[n]["checks"] if c["status"] == "fail"]
            if failed:
                bad[name] = "; ".join(f"{c['name']}: {c['detail']}" for c in failed)
    # lagging compute: against the median of the OTHER nodes (with two nodes: the other one)
    times = {n: t for n, r in reports.items() if names[n] not in bad and (t := r.get("matmul_s"))}
    for n, t in times.items():
        others = [v for m, v in times.items() if m != n]
        if others and t > slow_factor * statistics.median(others):
            ref = statistics.median(others)
            bad[names[n]] = (
                f"lagging: matmul {t * 1e3:.1f} ms is {t / ref:.1f}x the median of the other "
                f"nodes ({ref * 1e3:.1f} ms; preflight.slow_factor {slow_factor:g})"
            )
    busbw = None
    if net:
        busbw = net["busbw_gbps"]
        if not net.get("correct", True):
            warnings.append(f"the all-reduce over {', '.join(net['names'])} gave a wrong sum")
        pairs = net.get("pairs") or []
        if pairs:
            for n in net["members"]:
                mine = [p for p in pairs if n in (p["a"], p["b"])]
                rest = [p["seconds"] for p in pairs if n not in (p["a"], p["b"])]
                if not (mine and rest) or names[n] in bad:
                    continue
                med = statistics.median(rest)
                if all(p["seconds"] > slow_factor * med for p in mine):
                    best = min(p["seconds"] for p in mine)
                    bad[names[n]] = (
                        f"slow network: every all-reduce pair with this node took >= "
                        f"{best / med:.1f}x the median of the other pairs ({med * 1e3:.1f} ms; "
                        f"preflight.slow_factor {slow_factor:g})"
                    )
                for p in mine:
                    if not p.get("correct", True) and names[n] not in bad:
                        bad[names[n]] = "all-reduce with a neighbour gave a wrong sum"
        if expected_busbw and busbw < min_fraction * expected_busbw:
            warnings.append(
                f"all-reduce bus bandwidth {busbw:.2f} GB/s over {len(net['members'])} nodes "
                f"is below {min_fraction:g} x the expected {expected_busbw:g} GB/s"
                + (
                    ""
                    if pairs
                    else " (two nodes: the slow one cannot be named; run "
                    "`hpctrain doctor --bisect`)"
                )
            )
    for e in errors:
        warnings.append(f"all-reduce failed on {e['name']}: {e['error'][:300]}")
    good = [n for n in names if n not in bad]
    return good, bad, warnings, busbw


def partition_nodes(partition: str | None) -> list[str] | None:
    """Every node of the job's partition (sinfo), None when that cannot be known."""
    if not partition:
        return None
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-p", partition, "-o", "%N"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = sorted(set(out.stdout.split()))
    return names if out.returncode == 0 and names else None


def job_nodes(job_id: str | None) -> dict[str, list[str]]:
    """The job's ExcNodeList and ReqNodeList now, as host names (earlier exclusions are kept)."""
    found: dict[str, list[str]] = {"ExcNodeList": [], "ReqNodeList": []}
    if not job_id:
        return found
    try:
        out = subprocess.run(
            ["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return found
    for word in out.split():
        key, _, value = word.partition("=")
        if key in found and value and value != "(null)":
            try:
                found[key] = subprocess.run(
                    ["scontrol", "show", "hostnames", value],
                    capture_output=True,
                    text=True,
                    timeout=30,
                ).stdout.split()
            except (OSError, subprocess.TimeoutExpired):
                found[key] = value.split(",")
    return found


def requeue_update(
    bad: list[str], current: dict[str, list[str]], min_nodes: int, max_nodes: int
) -> list[str]:  # min_nodes, max_nodes: of the allocation (hot spares included)
    """What the requeued job must change: the bad nodes excluded (with earlier exclusions), out
    of a required node list, and the node count restated (Slurm narrows it to the allocation)."""
    exclude = sorted(set(current["ExcNodeList"]) | set(bad))
    update = [f"ExcNodeList={','.join(exclude)}"]
    if current["ReqNodeList"]:
        keep = [n for n in current["ReqNodeList"] if n not in bad]
        update.append(f"ReqNodeList={','.join(keep)}" if keep else "ReqNodeList=")
    update.append(f"NumNodes={min_nodes}-{max_nodes}")
    return update


def all_silent(
    names: list[str], good: list[str], bad: dict[str, str], warnings: list[str]
) -> tuple[list[str], dict[str, str], list[str]]:
    """No node reported in time: the gate could not judge (a slow shared filesystem, an overloaded
    machine), which names no node. Warn and go on with every node rather than fail the job."""
    if bad and not good and all(r.startswith(NO_REPORT) for r in bad.values()):
        return (
            list(names),
            {},
            [
                *warnings,
                "no node reported within the budget, so none is "
                "named; going on with all of them (raise preflight.budget_s)",
            ],
        )
    return good, bad, warnings


def decide(
    good: list[str],
    bad: dict[str, str],
    *,
    min_nodes: int,
    on_fail: str,
    can_requeue: bool,
    excluded: list[str],
    partition: list[str] | None = None,
    spares: int = 0,
) -> tuple[str, str, list[str]]:
    """(action, reason, exclude list). `partition`: every node of the job's partition, so a
    requeue that excludes too many of them to ever start again fails instead (Slurm would keep it
    PENDING with BadConstraints for good). `spares`: the hot spares a requeued job asks for again."""
    if not bad:
        return "ok", "", []
    named = ", ".join(f"{n} ({r})" for n, r in bad.items())
    if len(bad) > 1 and len(set(bad.values())) == 1:  # the same on every node: say it once
        named = f"{', '.join(bad)} ({next(iter(bad.values()))})"
    if not good:
        return (
            "fail",
            (
                f"every node failed its preflight checks, so the cause is the environment "
                f"or the profile, not a node: {named}"
            ),
            [],
        )
    exclude = sorted(set(excluded) | set(bad))
    if on_fail == "shrink" and len(good) >= min_nodes:
        return (
            "shrink",
            f"continuing on {len(good)} healthy node(s) without {', '.join(bad)}: {named}",
            exclude,
        )
    left = None if partition is None else [n for n in partition if n not in exclude]
    if can_requeue and left is not None and len(left) < min_nodes + spares:
        return (
            "fail",
            (
                f"{', '.join(bad)} failed the preflight checks, and without "
                f"{', '.join(exclude)} the partition has {len(left)} node(s) for a job of at "
                f"least {min_nodes + spares}, so a requeue could never start: {named}; fix: "
                "repair or replace the node, or submit with fewer --nodes (or --min-nodes, "
                "--spare-nodes)"
            ),
            exclude,
        )
    if can_requeue:
        return "requeue", f"excluding {', '.join(bad)} and requeueing: {named}", exclude
    return (
        "fail",
        (
            f"{', '.join(bad)} failed the preflight checks and the job may not requeue "
            f"(preemption.requeue off or max_restarts reached): {named}"
        ),
        exclude,
    )


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    names = [n for n in a.nodes.split(",") if n]
    v = _verdict(a, names)
    _record(a, names, v)
    for name, why in v.bad.items():
        print(f"hpctrain: preflight: node {name} failed: {why}", file=sys.stderr)
    for w in v.warnings:
        print(f"hpctrain: preflight: warning: {w}", file=sys.stderr)
    sys.stdout.write(v.shell())
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m hpctrain.checks.preflight.gate",
        description=__doc__,
        fromfile_prefix_chars="@",  # @FILE: the node lists, never one argument (templates/preflight)
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("folder", type=Path)
    ap.add_argument(
        "--nodes", required=True, help="node names, comma-separated, SLURM_NODEID order"
    )
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--min-nodes", type=int, required=True)
    ap.add_argument("--max-nodes", type=int, default=None, help="the request's node count")
    ap.add_argument("--on-fail", choices=("shrink", "requeue"), default="shrink")
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--slow-factor", type=float, default=2.0)
    ap.add_argument("--expected-busbw", type=float, default=None)
    ap.add_argument("--min-fraction", type=float, default=0.5)
    ap.add_argument("--can-requeue", type=int, default=1)
    ap.add_argument("--job-id", default=os.environ.get("SLURM_JOB_ID"))
    ap.add_argument("--restart-count", type=int, default=0)
    ap.add_argument("--started", type=float, default=None, help="epoch seconds the gate started")
    ap.add_argument("--train", help="hot spares: the training nodes (the rest: spares)")
    ap.add_argument("--spare-nodes", type=int, default=0, help="hot spares the job asks for")
    ap.add_argument("--when", choices=("start", "training"), default="start")
    return ap


def _verdict(a: argparse.Namespace, names: list[str]) -> Verdict:
    """The reports judged, bad training nodes swapped for good spares (--train), else the usual
    decision over what is left; with a requeue, what the requeued job changes."""
    good, bad, warnings, busbw = judge(
        a.folder,
        names,
        budget_s=a.budget_s,
        slow_factor=a.slow_factor,
        expected_busbw=a.expected_busbw,
        min_fraction=a.min_fraction,
    )
    good, bad, warnings = all_silent(names, good, bad, warnings)
    spare_mode = a.train is not None
    train = [n for n in (a.train or "").split(",") if n] if spare_mode else list(good)
    spots = place(names, train, [n for n in names if n not in train], bad) if spare_mode else None
    current = job_nodes(a.job_id) if bad else {"ExcNodeList": [], "ReqNodeList": []}
    settled = spares.settled(spots, bad) if spots is not None else None
    if settled is not None:  # every bad training node has a good spare in its place
        action, reason, exclude = *settled, list[str]()
    else:
        action, reason, exclude = decide(
            spots.train if spots is not None else good,
            bad,
            min_nodes=a.min_nodes,
            on_fail=a.on_fail,
            can_requeue=bool(a.can_requeue),
            excluded=current["ExcNodeList"],
            partition=partition_nodes(os.environ.get("SLURM_JOB_PARTITION")) if bad else None,
            spares=a.spare_nodes,
        )
    # the allocation's node counts: a requeued job asks for its spares again
    low, high = a.min_nodes + a.spare_nodes, (a.max_nodes or len(names)) + a.spare_nodes
    return Verdict(
        action=action,
        good=good,
        bad=bad,
        warnings=warnings,
        exclude=exclude,
        update=requeue_update(list(bad), current, low, high) if action == "requeue" else [],
        reason=reason,
        busbw_gbps=busbw,
        seconds=round(time.time() - a.started, 2) if a.started else None,
        train=spots.train if spots is not None else good,
        spares_left=spots.spares_left if spots is not None else [],
        swapped=spots.swapped if spots is not None and action == "swap" else [],
    )


def _record(a: argparse.Namespace, names: list[str], v: Verdict) -> None:
    """verdict.json, the run's preflight.json, and the events: `preflight` when a node failed or
    a warning was raised (a gate that passed is in those two files only), `spare_swapped`."""
    record = {"job_id": a.job_id, "restart_count": a.restart_count, "nodes": names, **asdict(v)}
    write_atomic(a.folder / VERDICT, json.dumps(record, indent=1) + "\n")
    run = RunFolder(a.run_dir)
    run.write(LATEST, json.dumps({**record, "folder": str(a.folder)}, indent=1) + "\n")
    if v.bad or v.warnings:
        run.event(
            "preflight",
            job_id=a.job_id,
            restart_count=a.restart_count,
            verdict=v.action,
            good=v.good,
            bad=v.bad,
            warnings=v.warnings,
            busbw_gbps=v.busbw_gbps,
            seconds=v.seconds,
        )
    spares.record(
        a.run_dir,
        v.swapped,
        v.bad,
        when=a.when,
        job_id=a.job_id,
        restart_count=a.restart_count,
        train=v.train,
        left=len(v.spares_left),
    )


if __name__ == "__main__":
    sys.exit(main())
