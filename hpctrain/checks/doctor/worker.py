"""What `hpctrain doctor` runs on every rank under torchrun: the node checks (local rank 0 of each
node, before any collective, so a broken network still leaves a diagnosis), then an all-reduce sweep
(allreduce.py) over the real backend (nccl on GPUs, gloo on CPU) that reports time, algorithm and bus
bandwidth per size like nccl-tests, and checks every sum.

    torchrun --standalone --nproc-per-node 2 -m hpctrain.checks.doctor.worker --out /tmp/doc --max-bytes 16777216
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

from hpctrain.checks.doctor import NodeReport, node_checks, write_report
from hpctrain.kernel import jobenv


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
    write_report(out / f"node-{node}.json", report.to_dict())


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
    # lazy: torch on a torch-free path (the node checks above run without it)
    from hpctrain.checks.doctor.allreduce import sweep

    return sweep(out, max_bytes=a.max_bytes, timeout_s=a.timeout_s)


if __name__ == "__main__":
    code = main()
    # gloo can abort a finished worker at interpreter exit (see train_entry.dist.exit_now)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
