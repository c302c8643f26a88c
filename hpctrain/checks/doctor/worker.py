"""What `hpctrain doctor` runs on every rank under torchrun: the node checks (local rank 0 of each
node, before any collective, so a broken network still leaves a diagnosis), then an all-reduce sweep
over the real backend (nccl on GPUs, gloo on CPU) that reports time, algorithm and bus bandwidth
per size like nccl-tests, and checks every sum.

    torchrun --standalone --nproc-per-node 2 -m hpctrain.checks.doctor.worker --out /tmp/doc --max-bytes 16777216
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from hpctrain.checks.doctor import NodeReport, node_checks, sweep_sizes
from hpctrain.kernel import jobenv
from hpctrain.kernel.files import write_atomic

WARMUP, ITERS = 5, 20  # nccl-tests' -w and -n defaults


def _write(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=2), durable=False)


def _head_name() -> str | None:
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return None
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30
        )
        return out.stdout.split()[0] if out.returncode == 0 and out.stdout.split() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def node_report(out: Path) -> None:
    node = jobenv.get(jobenv.NODEID, "0")
    endpoint = jobenv.get(jobenv.RDZV_ENDPOINT, "")
    addr, _, port = endpoint.rpartition(":")
    head = _head_name() or (addr or None)
    checks = node_checks(
        env=dict(os.environ),
        head=head,
        rdzv_addr=addr or None,
        port=int(port) if port.isdigit() else None,
        is_head=node == "0",
        expect_gpus=int(jobenv.get(jobenv.GPUS_PER_NODE) or 0),
        want_gpu=jobenv.get(jobenv.WANT_GPU) == "1",
        slurm=jobenv.get(jobenv.SCHEDULER) == "slurm",
        bind_port=False,  # the port is the live rendezvous store's: in use by design
        uses_nccl=jobenv.get(jobenv.DEVICE) == "cuda",
    )
    report = NodeReport(node, socket.gethostname(), checks)
    _write(out / f"node-{node}.json", report.to_dict())


def sweep(out: Path, max_bytes: int, timeout_s: float) -> int:
    import torch  # lazy: torch on a torch-free path (node_report runs without it)
    import torch.distributed as dist  # lazy: as above, only the collective sweep needs torch

    cuda = jobenv.get(jobenv.DEVICE, "cpu") == "cuda" and torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    rank = int(os.environ.get("RANK", "0"))
    try:
        if cuda:
            torch.cuda.set_device(
                int(os.environ.get("LOCAL_RANK", "0")) % max(1, torch.cuda.device_count())
            )
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    except Exception as e:  # noqa: BLE001 - reported with its likely cause, not re-raised
        _write(
            out / f"sweep-error-{rank}.json",
            {"error": f"{type(e).__name__}: {e}", "backend": backend},
        )
        return 1
    world = dist.get_world_size()
    device = torch.device("cuda") if cuda else torch.device("cpu")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    rows = []
    try:
        for nbytes in sweep_sizes(max_bytes):
            count = nbytes // 4
            buf = torch.empty(count, dtype=torch.float32, device=device)
            buf.fill_(1.0)
            # nccl-tests' method: warm-up, then `iters` timed calls between barriers; 20 calls
            # (its -n default) unless the probe says that takes over 1 s (large sizes on CPU)
            t1 = time.perf_counter()
            dist.all_reduce(buf)  # the first call sets up connections and buffers
            sync()
            probe = torch.tensor([time.perf_counter() - t1], dtype=torch.float64, device=device)
            dist.all_reduce(probe, op=dist.ReduceOp.MAX)  # every rank must agree on the counts
            each = max(float(probe.item()), 1e-6)
            iters = max(3, min(ITERS, int(1.0 / each)))
            for _ in range(min(WARMUP, iters)):
                dist.all_reduce(buf)
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf)
            sync()
            dist.barrier()
            elapsed = torch.tensor(
                [(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device
            )
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank, as nccl-tests
            buf.fill_(float(rank + 1))
            dist.all_reduce(buf)
            ok = torch.tensor(
                [bool(torch.all(buf == world * (world + 1) / 2))], dtype=torch.int32, device=device
            )
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            t = float(elapsed.item())
            algbw = nbytes / t / 1e9
            rows.append(
                {
                    "bytes": nbytes,
                    "count": count,
                    "time_us": t * 1e6,
                    "algbw_gbps": algbw,
                    "busbw_gbps": algbw * 2 * (world - 1) / world,
                    "correct": bool(ok.item()),
                }
            )
    except Exception as e:  # noqa: BLE001
        _write(
            out / f"sweep-error-{rank}.json",
            {"error": f"{type(e).__name__}: {e}", "backend": backend},
        )
        return 1
    finally:
        if rows and rank == 0:
            _write(
                out / "sweep.json",
                {"backend": backend, "world": world, "dtype": "float32", "rows": rows},
            )
    if (
        dist.get_backend() != "gloo"
    ):  # gloo's may hang a rank (train_entry/compat.py); exit closes it
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m hpctrain.checks.doctor.worker",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", type=Path, help=f"report folder (default ${jobenv.RUN_DIR}/doctor)")
    ap.add_argument("--max-bytes", type=int, default=256 << 20, help="largest all-reduce (bytes)")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="process-group timeout")
    ap.add_argument("--no-node-checks", action="store_true", help="only the sweep")
    a = ap.parse_args(argv)
    out = a.out or Path(jobenv.get(jobenv.RUN_DIR) or ".") / "doctor"
    out.mkdir(parents=True, exist_ok=True)
    if not a.no_node_checks and os.environ.get("LOCAL_RANK", "0") == "0":
        node_report(out)
    return sweep(out, a.max_bytes, a.timeout_s)


if __name__ == "__main__":
    code = main()
    # gloo can abort a finished worker at interpreter exit (see train_entry.dist.exit_now)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
