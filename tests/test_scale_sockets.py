"""Issue 37 ("a thousand nodes"): the sockets hpctrain's own gloo groups add per rank do not grow
with the world (the snapshot exchange and the async save's group connect lazily: only the pairs
their messages use), and snapshot partners sit on another rack, else N/2 nodes away.

The world: real gloo ranks forked by benchmarks/workers/sockets.py (2 simulated nodes per 4 ranks),
snapshots exchanged and restored, one async checkpoint save; the count: socket fds in
/proc/<pid>/fd after that, minus those after init_process_group (the default group's own)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from statistics import mean

import pytest

from hpctrain.jobs.request import JobRequest
from hpctrain.jobs.spec import JobSpec
from hpctrain.kernel import jobenv, partners
from hpctrain.profiles import resolve
from hpctrain.render.script import render

REPO = Path(__file__).resolve().parent.parent
# the per-rank max may grow by log2 of the world: gloo's tree broadcast (DCP's all-reduce of
# the save's results) gives a rank up to log2(N) peers; 4 -> 8 ranks: +1, seen +2 with the ring
TREE_SLACK = 2


def test_sockets_per_rank_stay_flat_from_4_to_8_ranks():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.workers.sockets", "4", "8"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env=env,
        check=True,
    ).stdout
    worlds = {d["world"]: d["rows"] for d in map(json.loads, out.splitlines())}
    for rows in worlds.values():
        assert all(r["restored"] for r in rows), rows  # the partners' copies came back
    small, big = ([r["added"] for r in worlds[n][1:]] for n in (4, 8))
    assert mean(big) <= mean(small) + 1, worlds  # before issue 37: 13 -> 25 (snapshots only)
    assert max(big) <= max(small) + TREE_SLACK, worlds
    # the snapshot exchange alone: its partner, its source and its ring neighbours, on every rank
    exchange = {n: {r["phases"]["get"] for r in rows} for n, rows in worlds.items()}
    assert exchange[4] == exchange[8] and len(exchange[8]) == 1, exchange
    # rank 0 is DCP's coordinator (it gathers every rank's plan): one socket per rank, no more
    assert worlds[8][0]["added"] - worlds[4][0]["added"] <= 4 + TREE_SLACK, worlds


def test_partners_are_on_another_rack_else_half_the_nodes_away():
    four = ["a", "a", "b", "b", "c", "c", "d", "d"]  # 4 nodes x 2 ranks
    assert partners.partners(four, [""] * 8) == [4, 5, 6, 7, 0, 1, 2, 3]  # node n -> n + N/2
    # racks interleaved with the node order: the partner is the next node of the other rack
    racks = ["r1", "r1", "r2", "r2", "r1", "r1", "r2", "r2"]
    pair = partners.partners(four, racks)
    assert all(racks[p] != racks[r] for r, p in enumerate(pair) if p is not None), pair
    assert sorted(p for p in pair if p is not None) == list(range(8))  # a permutation
    # unequal racks: every node of a rack no larger than half the nodes has its copy elsewhere
    six = ["a", "b", "c", "d", "e", "f"]
    racks = ["r1", "r1", "r1", "r2", "r2", "r3"]
    pair = partners.partners(six, racks)
    assert all(racks[p] != racks[r] for r, p in enumerate(pair) if p is not None), pair
    assert partners.sources(pair)[pair[0] or 0] == 0
    assert partners.partners(["a", "a"], ["", ""]) == [None, None]  # one node: no partner
    assert partners.partners(["a", "b"], ["", ""]) == [1, 0]


def test_a_restart_reads_a_lost_nodes_ranks_from_their_partners():
    meta = {"digest": 7, "world": 4}
    # ranks 0, 1 on node a, 2, 3 on node b; node b lost: node a holds copies of 2 and 3
    held = [("a", {0: {8: meta}, 1: {8: meta}, 2: {8: meta}, 3: {8: meta}})] * 2
    held += [("b", {})] * 2
    chosen = {r: (0, meta) for r in range(4)}  # choose: one reader per node (rank 0)
    got = partners.route(chosen, held, 8, partners.partners(["a", "a", "b", "b"], [""] * 4))
    assert {r: h for r, (h, _) in got.items()} == {0: 0, 1: 1, 2: 0, 3: 1}


def test_racks_come_from_the_profile_and_name_each_host_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no user profiles
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    assert partners.expand("gpu[001-003,010],login1") == [
        "gpu001",
        "gpu002",
        "gpu003",
        "gpu010",
        "login1",
    ]
    spec = json.dumps({"r1": "gpu[001-064]", "r2": "gpu[065-128]"})
    assert partners.rack_of("gpu065.cluster", spec) == "r2"
    assert partners.rack_of("other", spec) == partners.rack_of("gpu001", None) == ""
    profile = resolve("loopback", {"network.racks": {"r1": "n[1-2]", "r2": "n3"}})
    req = JobRequest.build(profile, name="racks", nodes=2, args=[])
    text = render(JobSpec.build(profile, req, tmp_path / "run"))
    line = next(ln for ln in text.splitlines() if ln.startswith(f"export {jobenv.RACKS}="))
    assert json.loads(shlex.split(line.partition("=")[2])[0]) == {"r1": "n[1-2]", "r2": "n3"}
    with pytest.raises(Exception, match="network.racks: racks 'r1' and 'r2' share nodes"):
        resolve("loopback", {"network.racks": {"r1": "n[1-2]", "r2": "n2"}})
    with pytest.raises(Exception, match="not a hostlist"):
        resolve("loopback", {"network.racks": {"r1": "n[a-b]"}})
