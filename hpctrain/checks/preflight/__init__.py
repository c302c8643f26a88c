"""The preflight gate: quick checks on every node of an allocation before training starts.

    node.py   what each node runs (one process per node, in parallel, inside the job's srun)
    poll.py   node.py's wait for the others: node 0 gathers the reports and publishes MEMBERS,
              the other nodes poll that one file (calls per node flat in the node count)
    allreduce.py  node.py's network part: the timed all-reduce between the nodes that passed
    smi.py    node.py's GPU health counters (nvidia-smi, rocm-smi)
    gate.py   what the batch shell runs after them: names the failing or lagging nodes, and says
              whether the job continues on all nodes, on the healthy ones, or excludes and requeues
    bisect.py `hpctrain doctor --bisect`: the failing node among N by halving

File names inside a gate's folder (`<run>/preflight/<job_id>-<restart>/`) and the environment
names used here are defined once, below. What is checked and how to tune it: docs/bad-nodes.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from hpctrain.kernel import jobenv, layout
from hpctrain.kernel.files import write_atomic

# environment names read by the gate (set by the rendered script / Slurm)
ENV_WANT_GPU = jobenv.WANT_GPU
ENV_GPUS_PER_NODE = jobenv.GPUS_PER_NODE
ENV_SCHEDULER = jobenv.SCHEDULER
ENV_RUN_DIR = jobenv.RUN_DIR

# files in a gate's folder
NODE_REPORT = "node-{node}.json"  # node.py: local checks of node index {node}
NODE_FAILURE = "fail-{node}.txt"  # the node command: node.py could not run (exit code, stderr tail)
MEMBERS = "members.json"  # node.py, node 0: who joins the all-reduce (the other nodes poll it)
NET_REPORT = "net.json"  # allreduce.py, group rank 0: the all-reduce between the nodes
NET_ERROR = "net-error-{node}.json"  # allreduce.py: the all-reduce failed on this node
VERDICT = "verdict.json"  # gate.py: the decision
LATEST = layout.PREFLIGHT_LATEST  # gate.py, in the run folder: the newest verdict (`status`)
FOLDER = layout.PREFLIGHT  # under the run folder


class Row(TypedDict):
    """One check of a node report (check, below): status pass | fail | warn | skip."""

    name: str
    status: str
    detail: str


class Phase(TypedDict):
    """When one part of a node's check ended (node.Phases): where the gate's time goes."""

    name: str
    at: float  # epoch seconds
    cpu_s: float  # the node process's CPU seconds so far (Python's start-up included)


class Phases:
    """The end of each part of a node's check (node.py), so a gate's cost splits by part inside a
    real job (benchmarks/preflight.py)."""

    def __init__(self) -> None:
        self.done: list[Phase] = []

    def mark(self, name: str) -> None:
        self.done.append(
            {"name": name, "at": round(time.time(), 3), "cpu_s": round(time.process_time(), 3)}
        )


class NodeJson(TypedDict):
    """NODE_REPORT: one node's local checks (node.local_report)."""

    node: int
    name: str
    host: str
    pid: int
    ok: bool
    when: str  # start | training
    checks: list[Row]
    matmul_s: float | None  # its slowest device's best matmul; None when a check failed
    device: str  # cuda | cpu
    addr: str
    port: int | None  # for the process group, should this node be its rank 0
    seconds: float
    phases: list[Phase]  # rewritten with the network part's once that ends


class Member(TypedDict):
    """One node of MEMBERS: what the others need to join its process group (no check rows, so
    the one file every node reads stays small: ~100 bytes a node)."""

    node: int
    name: str
    addr: str
    port: int | None


class Members(TypedDict):
    """MEMBERS: node 0's list of the nodes whose local checks passed (in node order; the first is
    the group's rank 0), and the nodes that reported nothing by its deadline."""

    members: list[Member]
    silent: list[int]


class Pair(TypedDict):
    """The all-reduce of one ring pair (node ids a and b)."""

    a: int
    b: int
    seconds: float
    busbw_gbps: float
    correct: bool


class NetJson(TypedDict):
    """NET_REPORT: the all-reduce between the nodes whose local checks passed (allreduce.py)."""

    members: list[int]
    names: list[str]
    bytes: int
    seconds: float
    busbw_gbps: float
    correct: bool
    pairs: list[Pair]  # with 3 or more nodes
    backend: str


class NetError(TypedDict):
    """NET_ERROR: the all-reduce failed on this node."""

    node: int
    name: str
    error: str


def check(name: str, ok: bool | None, detail: str) -> Row:
    """A check row like doctor's: status pass | fail | warn."""
    return {
        "name": name,
        "status": "pass" if ok else ("warn" if ok is None else "fail"),
        "detail": detail,
    }


def write_json(path: Path, data: Mapping[str, object]) -> None:
    """A report in a gate's folder, written atomically (node.py, allreduce.py)."""
    write_atomic(path, json.dumps(data, indent=1), durable=False)
