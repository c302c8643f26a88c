"""`hpctrain doctor --bisect`: find the failing or slow node among N by halving.

Each probe is one `srun` (its own short allocation, from the login node) of the preflight checks
(hpctrain/checks/preflight/node.py) on exactly the nodes asked for, judged as the in-job gate judges them
(gate.judge): a probe passes when no node fails or lags and, when the profile gives
`preflight.expected_busbw_gbps`, the all-reduce between them reaches its `min_busbw_fraction`.
That finds what only shows collectively (a slow link, a node that breaks the all-reduce) as well
as a node that fails alone. The result is the node list for `submit --exclude`.

    hpctrain doctor --profile mycluster --bisect RUN        # the nodes of RUN's newest job
    hpctrain doctor --profile mycluster --bisect --nodes 8  # any 8 nodes Slurm gives
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.checks.preflight import ENV_GPUS_PER_NODE, ENV_SCHEDULER, ENV_WANT_GPU, LATEST
from hpctrain.checks.preflight.gate import judge
from hpctrain.jobs.exports import environment_vars
from hpctrain.jobs.topology import gpu_directive
from hpctrain.kernel.errors import UserError

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile


@dataclass
class Probe:
    nodes: list[str]
    ok: bool
    bad: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    busbw_gbps: float | None = None
    seconds: float = 0.0


@dataclass
class Bisection:
    nodes: list[str]
    bad: dict[str, str]  # node -> why
    probes: list[Probe]
    note: str = ""

    @property
    def exclude(self) -> str:
        return ",".join(sorted(self.bad))

    def to_dict(self) -> dict[str, object]:
        return {
            "nodes": self.nodes,
            "bad": self.bad,
            "exclude": self.exclude,
            "note": self.note,
            "probes": [p.__dict__ for p in self.probes],
        }


def bisect(nodes: list[str], probe: Callable[[list[str]], Probe]) -> Bisection:
    """Halve until one node is left. A failing set whose halves both pass is a fault between
    them (a link, or a pairing): both halves' nodes are reported and narrowed no further."""
    probes: list[Probe] = []

    def run(sub: list[str]) -> Probe:
        p = probe(sub)
        probes.append(p)
        return p

    first = run(nodes)
    if first.ok:
        return Bisection(nodes, {}, probes, "every probe passed: no bad node among these")
    if first.bad:  # the gate already names nodes: confirm them alone, no halving needed
        return Bisection(nodes, dict(first.bad), probes)
    suspects, why = nodes, "; ".join(first.warnings) or "the probe failed"
    while len(suspects) > 1:
        half = len(suspects) // 2
        a, b = suspects[:half], suspects[half:]
        pa = run(a)
        if not pa.ok:
            suspects, why = a, _why(pa, why)
            continue
        pb = run(b)
        if not pb.ok:
            suspects, why = b, _why(pb, why)
            continue
        return Bisection(
            nodes,
            {n: f"each half passes alone, together they fail: {why}" for n in suspects},
            probes,
            "a fault between the halves (network path): exclude these and rerun",
        )
    return Bisection(nodes, {suspects[0]: why}, probes)


def _why(p: Probe, previous: str) -> str:
    return "; ".join([*p.bad.values(), *p.warnings]) or previous


def srun_probe(
    profile: ResolvedProfile,
    *,
    gpus: int | None,
    budget_s: float,
    workdir: Path,
    progress: Callable[[str], None] | None = None,
) -> Callable[[list[str]], Probe]:
    """A probe that runs the preflight checks with `srun` on exactly the given nodes (or on any N,
    given as ["*"] * N for the first probe of `--nodes N`)."""
    pf, s = profile.preflight, profile.slurm
    gpus = gpus if gpus is not None else s.gpus_per_node
    env = {
        **os.environ,
        **dict(environment_vars(profile)),
        ENV_SCHEDULER: "slurm",
        ENV_WANT_GPU: "1" if s.gpus_per_node else "0",
        ENV_GPUS_PER_NODE: str(gpus or 1),
        "OMP_NUM_THREADS": "1",
    }
    count = 0

    def probe(nodes: list[str]) -> Probe:
        nonlocal count
        count += 1
        out = workdir / f"probe-{count}"
        out.mkdir(parents=True)
        anyn = nodes[0] == "*"
        cmd = _srun(profile, nodes, count=count, gpus=gpus, budget_s=budget_s, out=out)
        t0 = time.monotonic()
        if progress:
            progress(f"probe {count}: {'any ' + str(len(nodes)) if anyn else ','.join(nodes)}")
        try:
            subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=budget_s + 600)
        except subprocess.TimeoutExpired:
            pass
        got = nodes
        if anyn and (out / "nodes.txt").is_file():
            got = (out / "nodes.txt").read_text().strip().split(",")
        good, bad, warnings, busbw = judge(
            out,
            got,
            budget_s=budget_s,
            slow_factor=pf.slow_factor,
            expected_busbw=pf.expected_busbw_gbps,
            min_fraction=pf.min_busbw_fraction,
        )
        slow = [w for w in warnings if "below" in w or "failed" in w or "wrong sum" in w]
        return Probe(
            nodes=got,
            ok=not bad and not slow,
            bad=bad,
            warnings=slow,
            busbw_gbps=busbw,
            seconds=round(time.monotonic() - t0, 2),
        )

    return probe


def _srun(
    profile: ResolvedProfile,
    nodes: list[str],
    *,
    count: int,
    gpus: int,
    budget_s: float,
    out: Path,
) -> list[str]:
    """One probe's `srun ... bash -c` (["*"] * N: any N nodes): node.py on every node, its
    stderr's tail in `fail-<node>.txt` when it could not run, the nodes given in nodes.txt."""
    pf, s = profile.preflight, profile.slurm
    cmd = [
        "srun",
        f"--nodes={len(nodes)}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=0",
        f"--time={max(1, int(budget_s // 60) + 2)}",
        f"--job-name=hpctrain-bisect-{count}",
    ]
    if nodes[0] != "*":
        cmd.append(f"--nodelist={','.join(nodes)}")
    for key in ("partition", "account", "qos", "reservation", "constraint"):
        if getattr(s, key):
            cmd.append(f"--{key}={getattr(s, key)}")
    gpu = gpu_directive(profile, gpus)
    if gpu:
        cmd.append(gpu)
    names = '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)'
    inner = (
        f'n={names}; echo "$n" >{_q(str(out))}/nodes.txt; '
        f'{_q(sys.executable)} -m hpctrain.checks.preflight.node --out {_q(str(out))} --nodes "$n" '
        f"--budget-s {budget_s:g} --matmul-n {pf.matmul_n} --allreduce-mib {pf.allreduce_mib} "
        f"2>{_q(str(out))}/stderr-$SLURM_NODEID.txt || "
        f"{{ echo $?; tail -n 5 {_q(str(out))}/stderr-"
        f"$SLURM_NODEID.txt; }} >{_q(str(out))}/fail-$SLURM_NODEID.txt"
    )
    return [*cmd, "bash", "-c", inner]


def _q(text: str) -> str:
    return shlex.quote(text)


def run_nodes(run_dir: Path) -> list[str]:
    """The nodes of a run's newest job: its last preflight verdict, else sacct's NodeList."""
    latest = run_dir / LATEST
    if latest.is_file():
        return list(json.loads(latest.read_text())["nodes"])
    jobs = (
        [json.loads(x) for x in (run_dir / "jobs.jsonl").read_text().splitlines() if x.strip()]
        if (run_dir / "jobs.jsonl").is_file()
        else []
    )
    if not jobs:
        return []
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-j", str(jobs[-1]["job_id"]), "-o", "NodeList"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.split()
    lists = [x for x in out if x and x != "None" and "assigned" not in x]
    if not lists:
        return []
    return subprocess.run(
        ["scontrol", "show", "hostnames", lists[-1]], capture_output=True, text=True, timeout=30
    ).stdout.split()


def run_bisect(
    profile: ResolvedProfile,
    *,
    run_dir: Path | None,
    nodes: int | None,
    gpus: int | None,
    progress: Callable[[str], None] | None = None,
) -> Bisection:

    if run_dir is not None:
        names = run_nodes(run_dir)
        if not names:
            raise UserError(
                f"{run_dir}: no node list (no preflight.json and sacct knows none); "
                "use --bisect --nodes N"
            )
    elif nodes:
        names = ["*"] * nodes
    else:
        raise UserError("--bisect needs a run (--bisect RUN) or a node count (--bisect --nodes N)")
    budget = float(profile.preflight.budget_s)
    with tempfile.TemporaryDirectory(prefix="hpctrain-bisect-") as tmp:
        probe = srun_probe(
            profile, gpus=gpus, budget_s=budget, workdir=Path(tmp), progress=progress
        )
        if names[0] == "*":  # the first probe says which nodes Slurm gave
            first = probe(names)
            names = first.nodes

            def probe_once(sub: list[str]) -> Probe:  # the whole set was just probed
                return first if sub == names else probe(sub)

            result = bisect(names, probe_once)
        else:
            result = bisect(names, probe)
    return result


def format_bisection(b: Bisection) -> str:
    lines = [f"hpctrain doctor --bisect: {len(b.nodes)} node(s): {','.join(b.nodes)}"]
    for p in b.probes:
        lines.append(
            f"  probe {','.join(p.nodes):30} {'pass' if p.ok else 'FAIL'}  {p.seconds:.1f} s"
            + (f"  busbw {p.busbw_gbps:.2f} GB/s" if p.busbw_gbps is not None else "")
        )
    for n, why in b.bad.items():
        lines.append(f"  bad node {n}: {why}")
    if b.note:
        lines.append(f"  {b.note}")
    lines.append(f"exclude: {b.exclude}" if b.bad else "exclude: (none)")
    return "\n".join(lines)
