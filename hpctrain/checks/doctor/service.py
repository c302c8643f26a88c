"""`hpctrain doctor`: run the node checks and the all-reduce sweep here (local profile) or as a short
job through the same rendered script as `submit` (entry `python -m hpctrain.checks.doctor.worker`) for a
Slurm profile, and collect the report."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain import dispatch
from hpctrain.checks.doctor.checks import (
    SLEEP_PORT,
    WRONG_IFACE,
    Check,
    NodeReport,
    ephemeral_range,
    node_checks,
)
from hpctrain.checks.doctor.report import Report, Sweep
from hpctrain.jobs.exports import environment_vars
from hpctrain.jobs.request import JobRequest
from hpctrain.jobs.spec import JobSpec
from hpctrain.kernel import jobenv, jobkey, states
from hpctrain.render.script import render
from hpctrain.runs.folder import TERMINAL, RunDir, runs_dir_of
from hpctrain.service.submit import start

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile

# --- running it -----------------------------------------------------------------------------------


def pick_port(profile: ResolvedProfile) -> int | None:
    """The rendered script's policy: inside the profile's range, never 29500, never ephemeral, free."""
    lo, hi = ephemeral_range()
    rz = profile.rendezvous
    span = max(1, rz.port_max - rz.port_min)
    start = os.getpid()
    for i in range(min(span, 256)):
        p = rz.port_min + (start + i) % span
        if p == SLEEP_PORT or lo <= p <= hi:
            continue
        try:
            with socket.socket() as s:
                s.bind(("", p))
            return int(p)
        except OSError:
            continue
    return None


def run_local(
    profile: ResolvedProfile, *, nodes: int, gpus: int, max_bytes: int, timeout_s: float
) -> Report:
    """The checks on this machine, then the sweep with nodes x gpus gloo workers under torchrun,
    with the profile's network environment (what the rendered script would export)."""
    env = dict(environment_vars(profile))
    rep = Report(profile=profile.name, scheduler="local", nodes=nodes, gpus=gpus)
    port = pick_port(profile)
    checks = node_checks(
        env=env,
        head="localhost",
        rdzv_addr="127.0.0.1",
        port=port,
        is_head=False,
        expect_gpus=0,
        want_gpu=False,
        slurm=False,
        bind_port=True,
    )
    if port is None:
        checks.append(
            Check(
                "port",
                "fail",
                f"no free port in {profile.rendezvous.port_min}-"
                f"{profile.rendezvous.port_max} outside 29500 and the ephemeral range",
                "the range is full or inside the ephemeral range",
                "set rendezvous.port_min/port_max in the profile",
            )
        )
    rep.node_reports.append(NodeReport("0", socket.gethostname(), checks))
    if any(c.failed for c in checks):
        rep.sweep = {
            "skipped": "not run: fix the failed checks above first",
            "backend": "gloo",
            "world": nodes * gpus,
        }
        return rep
    with tempfile.TemporaryDirectory(prefix="hpctrain-doctor-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "hpctrain.launchers.rdzv",
            "--nnodes=1",
            f"--nproc-per-node={nodes * gpus}",
            f"--rdzv-backend={jobkey.RDZV_BACKEND}",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--max-restarts=0",
            "-m",
            "hpctrain.checks.doctor.worker",
            "--out",
            tmp,
            "--no-node-checks",
            "--max-bytes",
            str(max_bytes),
            "--timeout-s",
            str(timeout_s),
        ]
        run_env = {**os.environ, **env, "OMP_NUM_THREADS": "1", jobenv.DEVICE: "cpu"}
        run_env[jobenv.JOB_KEY] = jobkey.fresh()  # the login node is shared: sign the rendezvous
        try:
            proc = subprocess.run(
                cmd,
                env=run_env,
                capture_output=True,
                text=True,
                timeout=timeout_s + 120,
                start_new_session=True,
            )
            log = (proc.stdout + proc.stderr)[-2000:]
        except subprocess.TimeoutExpired:
            log = f"the sweep did not finish in {timeout_s + 120:.0f} s: timed out"
        rep.sweep = collect_sweep(Path(tmp), nodes * gpus, log)
    return rep


def collect_sweep(folder: Path, world: int, log: str) -> Sweep:
    done = folder / "sweep.json"
    errors = sorted(folder.glob("sweep-error-*.json"))
    if errors:
        first = json.loads(errors[0].read_text())
        sweep: Sweep = (
            json.loads(done.read_text())
            if done.exists()
            else {"backend": first.get("backend"), "world": world}
        )
        sweep["error"] = first["error"]
        return sweep
    if done.exists():
        finished: Sweep = json.loads(done.read_text())
        return finished
    return {"backend": "?", "world": world, "error": "no result from the workers: " + log.strip()}


def run_slurm(
    profile: ResolvedProfile,
    *,
    nodes: int,
    gpus: int | None,
    max_bytes: int,
    timeout_s: float,
    wait_s: float,
    poll_s: float = 2.0,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """A short job through the normal path (JobRequest -> render -> run folder -> dispatch) whose
    entry is `python -m hpctrain.checks.doctor.worker`: the doctor exercises the script users get."""
    req, run, job_id = _start_job(
        profile, nodes=nodes, gpus=gpus, max_bytes=max_bytes, timeout_s=timeout_s
    )
    rep = Report(
        profile=profile.name,
        scheduler=profile.scheduler,
        nodes=req.nodes,
        gpus=req.gpus,
        job_id=job_id,
        run_dir=str(run.path),
    )
    state = _wait(run, job_id=job_id, wait_s=wait_s, poll_s=poll_s, progress=progress)
    if state not in TERMINAL:
        dispatch.cancel(run)
        rep.problems.append(
            Check(
                "job",
                "fail",
                f"job {job_id} still {state} after {wait_s:.0f} s; cancelled",
                "the queue is busy or the job hangs at rendezvous",
                "check `squeue`; rerun with a longer --wait-s, or read the node logs in "
                f"{run.path}/logs",
            )
        )
    others_failed = _node_reports(rep, run.path, req.nodes)
    out, logs = run.path / "doctor", run.path / "logs"
    log = _tail(*logs.glob("node-*.log"), logs / "batch.log")
    ran = (out / "sweep.json").exists() or list(out.glob("sweep-error-*.json"))
    if not ran and others_failed:
        rep.sweep = {
            "skipped": "not run: the job stopped at the failed checks above",
            "world": req.nodes * req.gpus,
        }
    else:
        rep.sweep = collect_sweep(out, req.nodes * req.gpus, log)
    if state != states.COMPLETED and not any(c.failed for c in rep.checks):
        rep.problems.append(
            Check(
                "job",
                "fail",
                f"job {job_id} ended {state}: {log}",
                "the job failed outside the checks",
                f"read {run.path}/logs",
            )
        )
    return rep


def _start_job(
    profile: ResolvedProfile, *, nodes: int, gpus: int | None, max_bytes: int, timeout_s: float
) -> tuple[JobRequest, RunDir, str]:
    """The doctor's job submitted: (its request, its run folder, its job id)."""
    if getattr(getattr(profile, "preflight", None), "enabled", False):
        # the doctor is the check: its own job skips the gate
        profile = profile.model_copy(deep=True)
        profile.preflight.enabled = False
    limit = profile.slurm.max_time_min
    req = JobRequest.build(
        profile,
        name=f"doctor-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}",
        nodes=nodes,
        gpus=gpus,
        time_min=min(5, limit) if limit else 5,
        module="hpctrain.checks.doctor.worker",
        args=("--max-bytes", str(max_bytes), "--timeout-s", str(int(timeout_s))),
    )
    run = RunDir(runs_dir_of(profile) / req.name)
    job_id = start(run, profile, req, render(JobSpec.build(profile, req, run.path)))
    return req, run, job_id


def _wait(
    run: RunDir,
    *,
    job_id: str,
    wait_s: float,
    poll_s: float,
    progress: Callable[[str], None] | None,
) -> str:
    """The job's state once it ended, or after `wait_s`; each new state told to `progress`."""
    deadline = time.monotonic() + wait_s
    state, seen = dispatch.state(run), ""
    while True:
        if progress and state != seen:
            progress(f"job {job_id}: {state}")
            seen = state
        if state in TERMINAL or time.monotonic() >= deadline:
            return state
        time.sleep(poll_s)
        state = dispatch.state(run)


def _node_reports(rep: Report, run: Path, nodes: int) -> bool:
    """Each node's report into `rep` (a node stopped by its own node command too), a problem for
    each node without one; whether some node's checks failed."""
    out, logs = run / "doctor", run / "logs"
    missing = []
    for n in range(nodes):
        f = out / f"node-{n}.json"
        if f.exists():
            rep.node_reports.append(NodeReport.from_dict(json.loads(f.read_text())))
        elif (early := _node_script_error(logs / f"node-{n}.log", n)) is not None:
            rep.node_reports.append(early)
        else:
            missing.append(n)
    others_failed = any(c.failed for r in rep.node_reports for c in r.checks)
    for n in missing:
        if others_failed:  # srun --kill-on-bad-exit stopped it: its checks never ran
            rep.problems.append(
                Check(
                    f"node {n}",
                    "skip",
                    f"node {n} was stopped when another node "
                    "failed (srun --kill-on-bad-exit); its checks did not run",
                )
            )
            continue
        rep.problems.append(
            Check(
                f"node {n}",
                "fail",
                f"node {n} wrote no report; last log lines: "
                + _tail(logs / f"node-{n}.log", logs / "batch.log"),
                "the workers never started: rendezvous failed (head name or port unreachable, wrong "
                "interface) or the environment/python is missing on the node",
                f"read {run}/logs; check the profile's network and environment settings",
            )
        )
    return others_failed


def _node_script_error(log: Path, node: int) -> NodeReport | None:
    """The rendered node command's own pre-flight failure ("hpctrain: error: network interface X
    ... does not exist on HOST"), which stops a node before the worker runs, as a node report."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    errors = [
        ln.removeprefix("hpctrain: error: ")
        for ln in text.splitlines()
        if ln.startswith("hpctrain: error: ")
    ]
    if not errors:
        return None
    host = re.search(r"hpctrain: node \d+ on (\S+)", text) or re.search(
        r" on ([\w.-]+);", errors[-1]
    )
    checks = []
    for e in errors:
        if "interface" in e:
            checks.append(
                Check(
                    "interface",
                    "fail",
                    e,
                    WRONG_IFACE,
                    "set network.socket_ifname (and gloo_socket_ifname) in the profile to "
                    "an interface every node has",
                )
            )
        else:
            checks.append(
                Check(
                    "node setup",
                    "fail",
                    e,
                    "the job's node command stopped before the workers started",
                    "see the message; fix the profile or the node",
                )
            )
    return NodeReport(str(node), host.group(1) if host else "?", checks)


def _tail(*files: Path, n: int = 5) -> str:
    lines: list[str] = []
    for f in files:
        try:
            lines += [ln for ln in f.read_text(errors="replace").splitlines() if ln.strip()][-n:]
        except OSError:
            continue
    return " | ".join(lines[-n:]) or "(no log)"
