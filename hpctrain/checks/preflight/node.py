"""One node's part of the preflight gate (one process per node, all nodes at once, inside the job).

    srun --ntasks-per-node=1 python -m hpctrain.checks.preflight.node --out RUN/preflight/J-0 --nodes n1,n2

1. Local checks, written to `node-<id>.json` before anything touches the network, so a node whose
   network is broken still leaves its diagnosis: the software stack (torch imports, the entry is found),
   doctor's node checks (interface, InfiniBand, GPUs visible, scontrol, /dev/shm), GPU health
   counters (nvidia-smi: uncorrected ECC, pending retired pages / row remaps), a matmul whose
   product is checked exactly (integer-valued inputs, Freivalds' test) and timed, and a NaN check.
2. The nodes whose local checks passed (node 0 gathers the reports and publishes who, poll.py)
   join one process group (gloo, or NCCL on GPUs) and time an all-reduce whose bus bandwidth the
   gate compares with the profile's figure; with 3 or more nodes also each ring pair, so a slow
   link names its node.

`--when training` (the hot-spare round after a failed training step, in a job start whose start
gate ran the full checks on every node) is the reduced check: it skips what cannot have changed
since then (SKIPPED_IN_TRAINING) and keeps every check that can find a node's hardware or network
bad.

Everything runs within the deadline (`--budget-s` from the start); stdlib only at import time, so
a broken torch is reported, not a traceback. The gate (gate.py) reads the files and decides.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import socket
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from hpctrain.checks.doctor import node_checks
from hpctrain.checks.preflight import (
    ENV_GPUS_PER_NODE,
    ENV_SCHEDULER,
    ENV_WANT_GPU,
    MEMBERS,
    NET_ERROR,
    NODE_REPORT,
    Member,
    Members,
    NetError,
    NodeJson,
    Phases,
    Row,
    check,
    write_json,
)
from hpctrain.checks.preflight.poll import gather, member, wait_members
from hpctrain.checks.preflight.smi import check_gpu_health
from hpctrain.kernel.support import torch_problem

if TYPE_CHECKING:
    import torch

# The reduced check (`--when training`) skips these, and only these. The start gate of this job
# start passed them on every node it now checks (the training nodes and the spares left: a node that
# failed then was swapped out or dropped), and their answer depends on software that is fixed for
# the job, not on the node's hardware, so a failed training step cannot have changed it. Kept:
# torch's import and release (the matmul and all-reduce need torch; a node whose Python no longer
# runs is a finding, fail-<id>.txt), doctor's node checks (an interface or InfiniBand port gone
# down, a GPU fallen off the bus, /dev/shm filled by dead ranks' files), the GPU health counters
# (ECC errors appear during training), devices, the exact matmul and NaN, lagging, and the
# all-reduce with its ring pairs: whatever can confirm a node bad after a failure.
SKIPPED_IN_TRAINING = {
    "entry": (
        "the entry's module lookup (or script compile) reads the job's code and Python "
        "environment, the same files as at the start gate; were they broken since, every node "
        "would fail alike (a software fault: no spare helps, the new step meets it at once)"
    ),
}


# --- local checks ------------------------------------------------------------------------------


def check_imports(
    entry_kind: str,
    entry_target: str,
    *,
    entry: bool = True,
    mark: Callable[[str], None] = lambda _: None,
) -> tuple[list[Row], ModuleType | None]:
    """torch (its release within hpctrain's supported range), then, with `entry`, the entry: its
    module found (train_entry's trainer, or a user module), or its script compiled. Not imported:
    the trainer's imports (torch.distributed.checkpoint, ~1 s of CPU) would be paid again by the
    training processes, which import it anyway and then run the checkpoint round trip, each node's
    first rank before the ranks meet (train_entry/checkpoint/roundtrip.py). `mark(phase)` after each
    part (Phases.mark)."""
    t0 = time.perf_counter()
    try:
        import torch  # lazy: the check itself: does torch import here
    except Exception as e:  # noqa: BLE001 - any import failure is the finding
        return [check("imports", False, f"import torch failed: {type(e).__name__}: {e}")], None
    mark("torch")
    rows = [
        check(
            "imports",
            True,
            f"torch {torch.__version__} in {time.perf_counter() - t0:.1f} s ({sys.executable})",
        )
    ]
    problem = torch_problem(torch.__version__)
    if problem:
        return [*rows, check("torch", False, problem)], torch
    if not entry:
        return rows, torch
    try:
        if entry_kind in ("train_entry", "module"):
            target = "train_entry.trainer" if entry_kind == "train_entry" else entry_target
            if importlib.util.find_spec(target) is None:
                raise ImportError(f"no module named {target!r} on this node's sys.path")
            rows.append(check("entry", True, f"module {target} found"))
        else:
            compile(Path(entry_target).read_bytes(), entry_target, "exec")
            rows.append(check("entry", True, f"script {entry_target} readable, compiles"))
        mark("entry")
    except Exception as e:  # noqa: BLE001
        rows.append(check("entry", False, f"the entry {entry_target}: {type(e).__name__}: {e}"))
    return rows, torch


def check_compute(
    torch: ModuleType, devices: list[torch.device], n: int
) -> tuple[list[Row], float | None]:
    """On each device: an exact integer-valued matmul checked by Freivalds' test (C v == A (B v) in
    float64), the best time of a few float32 matmuls on normal data, and that those are finite."""
    rows, worst = [], 0.0
    if devices and devices[0].type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator().manual_seed(1234)
    a_int = torch.randint(-2, 3, (n, n), generator=g).float()
    b_int = torch.randint(-2, 3, (n, n), generator=g).float()
    v = torch.randint(-3, 4, (n,), generator=g).double()
    want = a_int.double() @ (b_int.double() @ v)
    a_rand, b_rand = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    for dev in devices:
        # a GPU's matmul returns before it ends: each timing waits for it
        sync = partial(torch.cuda.synchronize, dev) if dev.type == "cuda" else _nothing
        c = (a_int.to(dev) @ b_int.to(dev)).double().cpu()
        if not torch.equal(c @ v, want):
            rows.append(
                check(
                    "matmul",
                    False,
                    f"{dev}: {n}x{n} integer matmul is WRONG "
                    f"(Freivalds' test, max error {(c @ v - want).abs().max().item():g})",
                )
            )
            continue
        a, b = a_rand.to(dev), b_rand.to(dev)
        out = a @ b
        sync()
        best, t_end, finite = float("inf"), time.perf_counter() + 0.15, True
        for _ in range(8):
            t0 = time.perf_counter()
            out = a @ b
            sync()
            best = min(best, time.perf_counter() - t0)
            finite = finite and bool(torch.isfinite(out).all())
            if time.perf_counter() > t_end:
                break
        worst = max(worst, best)
        rows.append(
            check(
                "matmul",
                True,
                f"{dev}: {n}x{n} exact; best {best * 1e3:.1f} ms "
                f"({2 * n**3 / best / 1e9:.1f} GFLOP/s)",
            )
        )
        rows.append(
            check(
                "nan",
                finite,
                f"{dev}: float32 matmul outputs " + ("finite" if finite else "contain NaN/Inf"),
            )
        )
    return rows, (worst if rows and all(r["status"] == "pass" for r in rows) else None)


def _nothing() -> None:
    pass


def skipped_rows() -> list[Row]:
    """The reduced check's record of what it did not run, and why (status `skip`)."""
    return [
        {"name": name, "status": "skip", "detail": f"not checked after a failed step: {why}"}
        for name, why in SKIPPED_IN_TRAINING.items()
    ]


def node_rows(gpus: int, want_gpu: bool, uses_nccl: bool) -> list[Row]:
    """doctor's node checks, as rows (those that do not apply here left out)."""
    return [
        {"name": c.name, "status": c.status, "detail": c.detail}
        for c in node_checks(
            env=dict(os.environ),
            head=None,
            rdzv_addr=None,
            port=None,
            is_head=False,
            expect_gpus=gpus,
            want_gpu=want_gpu,
            slurm=os.environ.get(ENV_SCHEDULER) == "slurm",
            bind_port=False,
            uses_nccl=uses_nccl,
        )
        if c.status != "skip"
    ]


def address(name: str) -> str:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def local_report(
    node: int, name: str, args: argparse.Namespace, phases: Phases | None = None
) -> NodeJson:
    t0 = time.perf_counter()
    phases = phases or Phases()
    want_gpu = os.environ.get(ENV_WANT_GPU) == "1"
    gpus = int(os.environ.get(ENV_GPUS_PER_NODE, "0") or 0)
    full = args.when == "start"
    # What waits on other programs (scontrol, nvidia-smi: up to a second a call on a GPU node, five
    # calls) or on DNS runs in a thread while this one imports torch, which holds the GIL only
    # between those waits. NCCL is assumed to be used when GPUs are asked for; should torch then
    # see none, a failed check is run again with the CPU's gloo in mind (doctor warns then)
    with ThreadPoolExecutor(1) as pool:
        waits = pool.submit(node_rows, gpus, want_gpu, want_gpu)
        health = pool.submit(check_gpu_health) if want_gpu else None
        addr = pool.submit(address, name)
        rows, torch = check_imports(
            args.entry_kind, args.entry_target, entry=full, mark=phases.mark
        )
        cuda = bool(torch is not None and want_gpu and torch.cuda.is_available())
        local, host = waits.result(), addr.result()
    if not full and torch is not None:
        rows += skipped_rows()
    if cuda != want_gpu and any(r["status"] == "fail" for r in local):
        local = node_rows(gpus, want_gpu, cuda)
    rows += local
    phases.mark("node checks")
    matmul_s = None
    if torch is not None:
        if cuda:
            assert health is not None  # cuda implies want_gpu
            rows.append(health.result())
            count = torch.cuda.device_count()
            rows.append(
                check("devices", count >= gpus, f"{count} CUDA device(s) visible, {gpus} requested")
            )
            devices = [torch.device("cuda", i) for i in range(min(count, gpus))]
        else:
            devices = [torch.device("cpu")]
        compute, matmul_s = check_compute(torch, devices, args.matmul_n)
        rows += compute
        phases.mark("compute")
    ok = all(r["status"] != "fail" for r in rows)
    port = None
    if ok:  # a port for the process group, should this node be its rank 0
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    return {
        "node": node,
        "name": name,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "ok": ok,
        "when": args.when,
        "checks": rows,
        "matmul_s": matmul_s,
        "device": "cuda" if cuda else "cpu",
        "addr": host,
        "port": port,
        "seconds": round(time.perf_counter() - t0, 3),
        "phases": list(phases.done),
    }


def main(argv: list[str] | None = None) -> int:
    phases = Phases()
    phases.mark("start")  # Python's start-up and this module's imports
    ap = argparse.ArgumentParser(
        prog="python -m hpctrain.checks.preflight.node",
        description=__doc__,
        fromfile_prefix_chars="@",  # @FILE: the node lists, never one argument (templates/preflight)
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--out", type=Path, required=True, help="the gate's folder (shared by all nodes)"
    )
    ap.add_argument(
        "--nodes",
        required=True,
        help="the allocation's node names, comma-separated, in SLURM_NODEID order",
    )
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--matmul-n", type=int, default=1024)
    ap.add_argument("--allreduce-mib", type=int, default=16)
    ap.add_argument(
        "--entry-kind", default="train_entry", choices=("train_entry", "module", "script")
    )
    ap.add_argument("--entry-target", default="train_entry")
    ap.add_argument(
        "--when",
        choices=("start", "training"),
        default="start",
        help="training: the reduced check after a failed training step (SKIPPED_IN_TRAINING)",
    )
    a = ap.parse_args(argv)
    start = time.monotonic()
    names = a.nodes.split(",")
    node = int(os.environ.get("SLURM_NODEID", "0"))
    name = (
        names[node]
        if node < len(names)
        else os.environ.get("SLURMD_NODENAME", socket.gethostname())
    )
    a.out.mkdir(parents=True, exist_ok=True)
    me = local_report(node, name, a, phases)
    report = a.out / NODE_REPORT.format(node=node)
    write_json(report, me)
    phases.mark("report")
    if len(names) < 2:
        return 0
    # the network part: the nodes whose local checks passed. Node 0 gathers the reports (until all
    # are in, or half the budget is gone: a node still silent then is the gate's finding) and
    # publishes who joins; every other node polls that one file, so no node's polling grows with
    # the node count
    members: list[Member] = []
    if node == 0:
        got = gather(a.out, len(names), start + a.budget_s * 0.5)
        members = [member(r) for _, r in sorted(got.items()) if r is not None and r["ok"]]
        silent = [n for n in range(len(names)) if n not in got]
        write_json(a.out / MEMBERS, Members(members=members, silent=silent))
    elif me["ok"]:
        published = wait_members(a.out, start + a.budget_s * 0.6)
        if published is None:
            error: NetError = {
                "node": node,
                "name": name,
                "error": "node 0 published no member list (it could not run, or hung), so this "
                "node joined no all-reduce",
            }
            write_json(a.out / NET_ERROR.format(node=node), error)
        else:
            members = published["members"]
    if not me["ok"] or len(members) < 2 or node not in [m["node"] for m in members]:
        return 0
    # lazy: torch on a torch-free path (the local checks above report a broken torch)
    from hpctrain.checks.preflight.allreduce import network

    phases.mark("members")
    deadline = start + a.budget_s * 0.9
    network(a.out, me=me, members=members, nbytes=a.allreduce_mib << 20, deadline=deadline)
    phases.mark("network")
    write_json(report, {**me, "phases": phases.done})
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # a finished gloo process may abort at interpreter exit (train_entry.dist.exit_now)
    os._exit(code)
