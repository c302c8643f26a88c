"""The reduced preflight node check (`node.py --when training`: the hot-spare round after a failed
training step) without a cluster: it skips the entry's lookup, and says so;
it still fails a node whose devices or matmul are wrong, still runs the all-reduce between the
nodes, and the gate still names a node on the slow end of every ring pair from reduced reports.
The batch script's side (which round passes which mode): tests/test_spares.py.

    .venv/bin/pytest -q tests/test_preflight_reduced.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.checks.preflight import ENV_GPUS_PER_NODE, ENV_WANT_GPU, gate, node

REPO = Path(__file__).resolve().parent.parent


def _args(out: Path, when: str, **kw: object) -> argparse.Namespace:
    base = {"entry_kind": "train_entry", "entry_target": "train_entry", "matmul_n": 64}
    return argparse.Namespace(out=out, when=when, **{**base, **kw})


def _by_name(report: dict) -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for r in report["checks"]:
        rows.setdefault(r["name"], []).append(r["status"])
    return rows


@pytest.fixture
def cpu_node(monkeypatch):
    monkeypatch.delenv(ENV_WANT_GPU, raising=False)
    monkeypatch.delenv(ENV_GPUS_PER_NODE, raising=False)


def test_the_reduced_check_skips_the_entry_and_says_why(tmp_path, monkeypatch, cpu_node):
    # an entry that does not exist: the full check fails it, the reduced one does not look
    missing = {"entry_kind": "module", "entry_target": "no_such_module_xyz"}
    full = node.local_report(0, "n1", _args(tmp_path / "full", "start", **missing))
    assert not full["ok"] and _by_name(full)["entry"] == ["fail"], full
    me = node.local_report(0, "n1", _args(tmp_path / "reduced", "training", **missing))
    rows = _by_name(me)
    assert me["ok"] and me["when"] == "training", me
    assert rows["entry"] == ["skip"] and "checkpoint" not in rows, rows
    assert set(node.SKIPPED_IN_TRAINING) == {"entry"}  # only this: say so in docs
    # what stays: torch's import, doctor's node checks, the exact matmul and NaN
    assert rows["imports"] == ["pass"] and rows["matmul"] == ["pass"] and rows["nan"] == ["pass"]
    assert "shm" in rows and me["matmul_s"]
    skipped = {r["name"]: r["detail"] for r in me["checks"] if r["status"] == "skip"}
    assert all(d.startswith("not checked after a failed step: ") for d in skipped.values())
    # the gate reads `skip` as no finding
    node_dir = tmp_path / "reduced"
    node_dir.mkdir(exist_ok=True)
    (node_dir / "node-0.json").write_text(json.dumps(me))
    good, bad, _, _ = gate.judge(
        node_dir, ["n1"], budget_s=30, slow_factor=2.0, expected_busbw=None, min_fraction=0.5
    )
    assert good == ["n1"] and not bad


def test_the_reduced_check_still_fails_a_wrong_matmul(tmp_path, monkeypatch, cpu_node):
    import torch

    monkeypatch.setattr(torch, "equal", lambda a, b: False)  # Freivalds' test sees a wrong product
    me = node.local_report(0, "n1", _args(tmp_path, "training"))
    assert not me["ok"] and _by_name(me)["matmul"] == ["fail"], me
    assert me["matmul_s"] is None  # no timing from a wrong device: not compared for lagging
    assert me["port"] is None  # a failed node offers no process group port


def test_the_reduced_check_still_fails_a_node_that_lost_a_gpu(tmp_path, monkeypatch):
    """A GPU fallen off the bus after the start gate: fewer CUDA devices than requested."""
    import torch

    monkeypatch.setenv(ENV_WANT_GPU, "1")
    monkeypatch.setenv(ENV_GPUS_PER_NODE, "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(node, "check_compute", lambda torch, devices, n: ([], None))
    me = node.local_report(0, "n1", _args(tmp_path, "training"))
    rows = _by_name(me)
    assert not me["ok"] and rows["devices"] == ["fail"], me
    assert rows["entry"] == ["skip"]


@pytest.mark.parametrize("cuda", [False, True])
def test_an_nccl_interface_that_fails_counts_only_where_nccl_runs(tmp_path, monkeypatch, cuda):
    """doctor's checks run in a thread while torch imports, assuming NCCL when GPUs are asked for;
    on a node whose torch then sees no CUDA (its workers run gloo) the NCCL interface only warns."""
    import torch

    monkeypatch.setenv(ENV_WANT_GPU, "1")
    monkeypatch.setenv(ENV_GPUS_PER_NODE, "1")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "=no_such_if0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(node, "check_compute", lambda torch, devices, n: ([], None))
    me = node.local_report(0, "n1", _args(tmp_path, "training"))
    assert _by_name(me)["interface (nccl)"] == ["fail" if cuda else "warn"], me
    assert me["ok"] is not cuda and me["device"] == ("cuda" if cuda else "cpu"), me
    assert ("gpu health" in _by_name(me)) is cuda  # nvidia-smi's counters: only for CUDA devices


def test_the_gate_names_a_slow_link_from_reduced_reports(tmp_path, cpu_node):
    names = ["a", "b", "c"]
    for n, name in enumerate(names):
        me = node.local_report(n, name, _args(tmp_path, "training"))
        assert me["ok"] and me["matmul_s"], me
        # three runs on one loaded machine time their matmuls apart: compare the links only
        (tmp_path / f"node-{n}.json").write_text(json.dumps({**me, "matmul_s": 0.01}))
    pairs = [
        {"a": 0, "b": 1, "seconds": 0.01},
        {"a": 1, "b": 2, "seconds": 0.05},
        {"a": 2, "b": 0, "seconds": 0.05},
    ]
    net = {"members": [0, 1, 2], "names": names, "busbw_gbps": 1.0, "correct": True}
    (tmp_path / "net.json").write_text(json.dumps({**net, "pairs": pairs}))
    _, bad, _, _ = gate.judge(
        tmp_path, names, budget_s=30, slow_factor=2.0, expected_busbw=None, min_fraction=0.5
    )
    assert list(bad) == ["c"] and bad["c"].startswith("slow network"), bad


def test_two_reduced_node_processes_run_the_all_reduce(tmp_path):
    """Two real node processes (gloo over loopback) in training mode: the all-reduce still runs
    between them and its sum is checked (net.json), with the entry skipped."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", ENV_WANT_GPU, ENV_GPUS_PER_NODE):
        env.pop(key, None)
    cmd = [sys.executable, "-W", "ignore", "-m", "hpctrain.checks.preflight.node", "--out",
           str(tmp_path), "--nodes", "localhost,localhost", "--budget-s", "120", "--matmul-n",
           "64", "--allreduce-mib", "1", "--when", "training"]  # fmt: skip
    procs = [
        subprocess.Popen(
            cmd,
            env={**env, "SLURM_NODEID": str(i)},
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        for i in range(2)
    ]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for i in range(2):
        me = json.loads((tmp_path / f"node-{i}.json").read_text())
        assert me["ok"] and me["when"] == "training", me
        assert "checkpoint" not in _by_name(me)
        # where the time went (benchmarks/preflight.py reads it): each part, in order
        names = [p["name"] for p in me["phases"]]
        assert names == [
            "start", "torch", "node checks", "compute", "report", "members", "network"
        ], names  # fmt: skip
        cpu = [p["cpu_s"] for p in me["phases"]]
        assert cpu == sorted(cpu) and cpu[-1] > 0, me["phases"]
    net = json.loads((tmp_path / "net.json").read_text())
    assert net["members"] == [0, 1] and net["correct"] and net["busbw_gbps"] > 0, net
