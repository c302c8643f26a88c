"""Scale of the rendezvous and of the batch script's arguments (issue 37), in simulation.

Store bytes: N torchrun handlers (hpctrain's, launchers/rdzv.build) over one in-memory c10d store,
a complete round of N participants written once, then one keep-alive interval (1 s here, 5 s in
torch's default) of real time with every handler's heartbeats started as `next_rendezvous` starts
them; counted: the bytes every agent sends to the store (set, compare_set: key + value, failed
compare-and-sets included). torch's own handler is the reference at 4 and 64 nodes (its beats
are a compare-and-set of the whole state each: ~N^2 bytes per interval).

Arguments: the rendered Slurm script run with stand-ins for srun, scontrol and the node Python
(hosts `localhost`, `node00001`, ...), with hot spares and with the preflight gate; each stand-in
records its longest argument. A list passed as one argument grows ~11 bytes a node and meets
Linux's 128 KiB limit per argument (E2BIG) near 12,000 nodes.

    .venv/bin/python -m benchmarks.run scale   (the scale group)
"""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from torch.distributed import HashStore  # type: ignore[attr-defined]  # not in torch's stubs' exports
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    _RendezvousState,
    create_handler,
)

from benchmarks import common
from hpctrain.kernel import jobenv, jobkey
from hpctrain.launchers import rdzv

STORE_NODES = (4, 64, 1024)
ARG_NODES = (2, 1024, 16384)
INTERVAL_S = 1  # torch takes whole seconds


class Counting:
    """The backend's store, counting what is sent to it (the head's traffic)."""

    def __init__(self, inner: HashStore) -> None:
        self.inner, self.sent, self.received = inner, 0, 0

    def get(self, key: str) -> bytes:
        got: bytes = self.inner.get(key)
        self.received += len(got)
        return got

    def set(self, key: str, value: str) -> None:
        self.sent += len(key) + len(value)
        self.inner.set(key, value)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        self.sent += len(key) + len(expected) + len(desired)
        got: bytes = self.inner.compare_set(key, expected, desired)
        return got

    def add(self, key: str, value: int) -> int:
        self.sent += len(key) + 8
        self.received += 8
        return int(self.inner.add(key, value))


def store_bytes(nodes: int, *, ours: bool = True) -> int:
    """Bytes sent to the store in one keep-alive interval by `nodes` agents of a complete round."""
    return traffic(nodes, ours=ours, looks=False)[0]


def traffic(nodes: int, *, ours: bool = True, looks: bool = True) -> tuple[int, int]:
    """(bytes sent in one interval, bytes read by one look of every agent). A look: how many
    nodes wait, what torchrun's agent asks at every look at its workers (0.5 s); torch reads the
    whole state, at most once a second; hpctrain's agents read the write count once nothing
    changed for a second (rdzv.Writes: two looks 1.2 s apart settle it, the third is measured)."""
    secret, run = bytes.fromhex(jobkey.fresh()), "bench"
    store = HashStore()
    counting = Counting(store)
    handlers: list[DynamicRendezvousHandler] = []
    guards: list[rdzv.Guarded] = []
    for _ in range(nodes):
        params = RendezvousParameters(
            "hpctrain", "bench:0", run, nodes, nodes, keep_alive_interval=INTERVAL_S
        )
        inner = C10dRendezvousBackend(counting, run)  # type: ignore[arg-type]  # duck-typed store
        if ours:  # the write count in the counted store too
            guards.append(rdzv.build(counting, inner, params, secret))  # type: ignore[arg-type]
            h = guards[-1]._inner
        else:
            h = create_handler(store, rdzv.Signed(inner, secret, run, "bench:0"), params)
        assert isinstance(h, DynamicRendezvousHandler)
        handlers.append(h)
    state = _RendezvousState()
    now = datetime.now(UTC)
    for rank, h in enumerate(handlers):
        state.participants[h._this_node] = rank
        state.last_heartbeats[h._this_node] = now
    state.complete = True
    rdzv.Signed(C10dRendezvousBackend(store, run), secret, run, "bench:0").set_state(
        pickle.dumps(state)
    )
    counting.sent = 0
    for h in handlers:
        h._start_heartbeats()  # what next_rendezvous does once a round is complete
    time.sleep(INTERVAL_S * 1.5)  # one beat each, not two
    for h in handlers:
        h._stop_heartbeats()
    sent = counting.sent
    if looks and ours:
        for _ in range(2):
            for g in guards:
                g.num_nodes_waiting()
            time.sleep(rdzv.CACHE_S + 0.2)
    if looks and not ours:
        time.sleep(rdzv.CACHE_S + 0.2)  # past the state holder's cache
    counting.received = 0
    for w in (guards or handlers) if looks else ():
        w.num_nodes_waiting()
    return sent, counting.received


def exponent(sizes: tuple[int, ...], values: list[float]) -> float:
    """The growth exponent between the smallest and the largest size (0 when flat; +1 each side,
    so that zero bytes at every size reads as flat)."""
    return math.log((values[-1] + 1) / (values[0] + 1)) / math.log(sizes[-1] / sizes[0])


STANDIN = """#!/bin/bash
# records this command's longest argument; srun runs its command once (node 0)
n=0; for a in "$@"; do if [ ${#a} -gt $n ]; then n=${#a}; fi; done
echo "$(basename "$0") $n" >>"$RECORD/args"
case "$(basename "$0")" in
  scontrol)
    if [ "$1 $2" = "show hostnames" ]; then
      echo localhost; for ((i = 1; i < SLURM_NNODES; i++)); do printf 'node%05d\\n' "$i"; done
    fi ;;
  srun) while [ "${1#-}" != "$1" ]; do shift; done; SLURM_NODEID=0 "$@" ;;
  python)
    if [ "$1" = -c ]; then exec python3 "$@"; fi
    if [ "$2" = hpctrain.checks.preflight.gate ]; then echo hpctrain_gate=ok; fi ;;
esac
exit 0
"""


def longest_args(nodes: int, flags: dict[str, object], root: Path) -> dict[str, int]:
    """The rendered Slurm script of `nodes` nodes, run with stand-ins: each command's longest
    argument (a list passed as one argument is the largest by far)."""
    from hpctrain.jobs.request import JobRequest  # lazy: the render stack, only for this figure
    from hpctrain.jobs.spec import JobSpec
    from hpctrain.profiles import resolve
    from hpctrain.render.script import render

    bin_, rec = root / "bin", root / "record"
    bin_.mkdir(parents=True)
    rec.mkdir()
    for name in ("srun", "scontrol", "python"):
        (bin_ / name).write_text(STANDIN)
        (bin_ / name).chmod(0o755)
    before = os.environ.get(jobenv.PYTHON)
    os.environ[jobenv.PYTHON] = str(bin_ / "python")  # the profile's node Python: the stand-in
    try:
        profile = resolve("loopback", {**LIFT, **flags})
        req = JobRequest.build(profile, name="big", nodes=nodes, gpus=1, args=[])
        text = render(JobSpec.build(profile, req, str(root / "runs" / "big")))
    finally:
        if before is None:
            del os.environ[jobenv.PYTHON]
        else:
            os.environ[jobenv.PYTHON] = before
    spare = int(str(flags.get("preemption.spare_nodes", 0)))
    (root / "job.sh").write_text(text)
    env = {
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "RECORD": str(rec),
        "HOME": str(root),
        jobenv.PYTHON: str(bin_ / "python"),
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": str(nodes + spare),
        "SLURM_JOB_NODELIST": f"localhost,node[00001-{nodes + spare - 1:05d}]",
    }
    out = subprocess.run(["bash", str(root / "job.sh")], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(
            f"the {nodes}-node script failed ({out.returncode}): {out.stderr[-2000:]}"
        )
    got: dict[str, int] = {}
    for line in (rec / "args").read_text().splitlines():
        name, n = line.split()
        got[name] = max(got.get(name, 0), int(n))
    return got


LIFT = {"preflight.enabled": False, "slurm.max_nodes": 20000}  # loopback allows 3 nodes
ARG_CASES: dict[str, dict[str, object]] = {
    "spares": {"preemption.spare_nodes": 1},  # the training nodes' list, the launch's --nodelist
    "gate": {"preflight.enabled": True},  # every node's checks, the verdict
    "both": {"preemption.spare_nodes": 1, "preflight.enabled": True},  # the verdict's --train
}


def run(quick: bool) -> list[common.Row]:
    both = [traffic(n) for n in STORE_NODES]
    ours = [float(b[0]) for b in both]
    reads = [b[1] / n for b, n in zip(both, STORE_NODES, strict=True)]  # per agent
    torch_reads = [traffic(n, ours=False)[1] / n for n in STORE_NODES[:2]]
    torch_ref = [float(store_bytes(n, ours=False)) for n in STORE_NODES[:2]]
    e = exponent(STORE_NODES, ours)
    rows = [
        common.result(
            "scale_rdzv_store_bytes_exponent",
            e,
            "<= 0.1",
            e <= 0.1,
            summary="bytes sent to the c10d store per keep-alive interval by every agent, "
            f"{'/'.join(map(str, STORE_NODES))} nodes: {'/'.join(f'{b:.0f}' for b in ours)} "
            f"(torch's own handler at {STORE_NODES[0]}/{STORE_NODES[1]}: "
            f"{'/'.join(f'{b:.0f}' for b in torch_ref)}, exponent "
            f"{exponent(STORE_NODES[:2], torch_ref):.2f})",
            nodes=list(STORE_NODES),
            bytes=ours,
            torch_bytes=torch_ref,
        ),
        common.result(
            "scale_rdzv_look_bytes_exponent",
            exponent(STORE_NODES, reads),
            "<= 0.1",
            exponent(STORE_NODES, reads) <= 0.1,
            summary="bytes one agent reads from the store per look (how many nodes wait) once "
            f"nothing changes, {'/'.join(map(str, STORE_NODES))} nodes: "
            f"{'/'.join(f'{b:.0f}' for b in reads)}: the write count (torch's own answer, the "
            "whole state, at most once a second, at "
            f"{STORE_NODES[0]}/{STORE_NODES[1]}: {'/'.join(f'{b:.0f}' for b in torch_reads)}, "
            f"exponent {exponent(STORE_NODES[:2], torch_reads):.2f})",
            nodes=list(STORE_NODES),
            bytes=reads,
            torch_bytes=torch_reads,
        ),
    ]
    longest: list[float] = []
    per_case: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in ARG_NODES:
            worst = 0
            for case, flags in ARG_CASES.items():
                got = longest_args(n, flags, Path(tmp) / f"{case}-{n}")
                per_case.setdefault(case, []).append(max(got.values()))
                worst = max(worst, *got.values())
            longest.append(float(worst))
    e = exponent(ARG_NODES, longest)
    rows.append(
        common.result(
            "scale_rdzv_longest_argument_exponent",
            e,
            "<= 0.1",
            e <= 0.1,
            summary=f"the rendered job's longest argument at {'/'.join(map(str, ARG_NODES))} "
            f"nodes: {'/'.join(f'{b:.0f}' for b in longest)} bytes (hot spares; preflight gate)",
            nodes=list(ARG_NODES),
            longest=longest,
            per_case=per_case,
        )
    )
    return rows


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(row)
