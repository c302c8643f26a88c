"""Issue 37 at scale, in simulation (benchmarks/scale_gate.py has the simulation and the fabricated
run; the bench reports the same counts as figures):
- the gate's polling: filesystem calls per node flat from 4 to 1,024 nodes; node 0 reads each
  report once; a member list that is a link, or a node 0 that could not run, ends no node's wait
  wrongly;
- `status` of a failed 1,000 x 8 run reads <= 10 MB and still names the first failed rank;
- the watchdog's heartbeat never fsyncs.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import scale_gate as sim  # noqa: E402
from hpctrain.checks.preflight import MEMBERS, NODE_FAILURE, poll  # noqa: E402


def test_gate_polling_is_flat_in_the_node_count(tmp_path):
    runs = {n: sim.simulate_gate(tmp_path / str(n), n) for n in (4, 64, 1024)}
    small, big = runs[4], runs[1024]
    growth = math.log(big.mean / small.mean) / math.log(1024 / 4)
    assert growth <= 0.1, (growth, runs)
    # a node other than 0: the same few dozen calls at 1,024 nodes as at 4 (one open and one
    # lstat a poll; the polls depend on how long it waits, not on how many nodes there are)
    assert big.others_max <= small.others_max + 12 and big.others_max <= 40, runs
    # node 0 reads each report once (open + fstat), plus its polls: O(N) once, not per poll
    assert big.node0 <= 2 * 1024 + 40, runs
    # what issue 37 measured: every node stat-ed every report every 0.2 s (~47.5k at 1,024)
    assert big.mean < 1024 / 20, runs


def test_a_member_list_that_is_a_link_is_not_trusted(tmp_path):
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps({"members": [], "silent": []}))
    (tmp_path / MEMBERS).symlink_to(real)
    clock = [0.0]

    def sleep(s: float) -> None:
        clock[0] += s

    assert poll.wait_members(tmp_path, 3.0, clock=lambda: clock[0], sleep=sleep) is None
    assert clock[0] >= 3.0  # it waited to the deadline: the link was never read


def test_a_node_0_that_could_not_run_ends_the_others_wait(tmp_path):
    (tmp_path / NODE_FAILURE.format(node=0)).write_text("1\nNo module named 'hpctrain'\n")
    clock = [0.0]

    def sleep(s: float) -> None:
        clock[0] += s

    assert poll.wait_members(tmp_path, 30.0, clock=lambda: clock[0], sleep=sleep) is None
    assert clock[0] < 1.0


def test_status_of_a_failed_1000_x_8_run_reads_at_most_10_mb(tmp_path):
    warm = sim.make_run(tmp_path, "warm")
    sim.fabricate_failed_run(warm, nodes=2, per=8, log_kb=4)
    sim.status_bytes(warm)  # status's lazy imports read files too: outside the count
    run = sim.make_run(tmp_path, "big")
    sim.fabricate_failed_run(run)
    assert len(list((run / "logs").glob("*.log"))) == 9000
    read, cause = sim.status_bytes(run)
    assert read <= 10 << 20, read  # issue 37: 1.7 GB for the same run
    assert cause is not None, read
    assert (cause["rank"], cause["kind"], cause["host"]) == (sim.FIRST_RANK, "exception", "n417")
    assert cause["error"] == sim.FIRST_ERROR


def test_the_heartbeat_never_fsyncs(tmp_path):
    fsyncs, writes = sim.heartbeat_fsyncs(tmp_path, minutes=2)
    assert fsyncs == 0
    assert 2 <= writes <= 6  # stall_s 300: every 30 s, for people (which process is rank R)
    beat = json.loads((tmp_path / "heartbeat" / "rank-0.json").read_text())
    assert beat["rank"] == 0 and beat["step"] > 0
