"""The benchmark harness: it produces the results JSON and Markdown in the agreed shape.

No timing is asserted here (figures belong to `make bench`); these tests check the harness's
behaviour: shape, target checks, steady-state arithmetic, honest "not measured" rows.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import common  # noqa: E402
from benchmarks import run as harness  # noqa: E402
from benchmarks.baselines.raw_write import raw_write  # noqa: E402

KEYS = {"name", "ratio", "spread", "target", "verdict", "meets", "details"}


def test_check_reads_every_target_form():
    assert common.check(0.99, ">= 0.98") and not common.check(0.97, ">= 0.98")
    assert common.check(0.1, "<= 0.1") and not common.check(0.11, "<= 0.1")
    assert common.check(0.9, "< 1.0") and not common.check(1.0, "< 1.0")
    assert common.check(0, "<= 0") and not common.check(1, "<= 0")


def test_a_spread_that_straddles_the_target_is_not_settled():
    met = common.settle("x", [1.00, 1.01, 0.99, 1.02, 1.00], ">= 0.98")
    assert met["verdict"] == "met" and met["meets"] is True and met["ratio"] == 1.0
    missed = common.settle("x", [0.90, 0.91, 0.92, 0.89, 0.90], ">= 0.98")
    assert missed["verdict"] == "missed" and missed["meets"] is False
    noisy = common.settle("x", [0.90, 1.05, 0.97, 1.10, 0.95], ">= 0.98")
    assert noisy["verdict"] == "not settled" and noisy["meets"] is None
    lo, hi = noisy["spread"]
    assert lo < 0.98 < hi and noisy["details"]["per_rep"] == [0.9, 1.05, 0.97, 1.1, 0.95]
    assert common.spread_of([3.0, 1.0, 2.0]) == (1.0, 3.0)  # < 4 values: the range
    stated = common.settle("x", [0.90, 1.05, 0.97, 1.10, 0.95], "-")  # no target: no verdict
    assert stated["verdict"] == "stated" and stated["meets"] is None
    assert stated["spread"] == noisy["spread"] and stated["details"]["per_rep"][1] == 1.05


def test_the_paired_schedule_warms_every_side_then_rotates_the_rounds():
    from benchmarks.training import schedule

    got = schedule(["te", "a", "b"], warmup=6, reps=2, block=2)
    assert got[:3] == [("te", -2, -2), ("a", -2, -2), ("b", -2, -2)]  # warm-ups first
    assert got[3:6] == [("b", -1, -1), ("te", -1, -1), ("a", -1, -1)]  # round -1: not counted
    rounds = [got[k : k + 3] for k in range(6, len(got), 3)]
    assert len(rounds) == 4  # reps x block
    assert [[s for s, _, _ in r] for r in rounds] == [
        ["te", "a", "b"],
        ["a", "b", "te"],
        ["b", "te", "a"],
        ["te", "a", "b"],
    ]
    assert [{rep for _, rep, _ in r} for r in rounds] == [{0}, {0}, {1}, {1}]


def test_paired_rates_read_rank_0_and_the_odd_rounds_alone():
    from benchmarks import training

    # rank 0: 0.5 s steps in repetition 0 (0.25 s in its odd rounds), 0.25 s in repetition 1
    side = [
        [
            {"gaps": [0.5, 0.5, 0.5, 0.25, 0.25], "odd": [0.25, 0.25], "cpu": 2.0, "steps": 5},
            {"gaps": [0.25] * 4, "odd": [0.25, 0.25], "cpu": 1.0, "steps": 4},
        ],
        [{"gaps": [9.0], "odd": [9.0], "cpu": 3.0, "steps": 5}] * 2,  # rank 1: only its CPU
    ]
    assert training.rates(side) == [pytest.approx(2.0), pytest.approx(4.0)]
    assert training.same_launch(side) == [pytest.approx(2.0), pytest.approx(1.0)]
    assert training.cpu_ms(side) == pytest.approx(1000 * (2 + 1 + 3 + 3) / 9)


def test_the_callback_segments_alternate_abba_and_skip_each_first_interval():
    from benchmarks import hf_trainer

    assert [hf_trainer.on(j) for j in range(8)] == [True, False, False, True] * 2
    # 2 warm-up steps, then segments of 3 steps: "on" ones at 1 s a step, "off" ones at 0.5 s,
    # and 100 s between segments (never an interval: each segment's first is left out)
    times, t = [0.0, 1.0], 1.0
    for j in range(8):
        t += 100.0
        for _ in range(3):
            t += 1.0 if hf_trainer.on(j) else 0.5
            times.append(t)
    got = hf_trainer.rates(times, warmup=2, segment=3, pairs=2)
    assert got["on"] == [pytest.approx(1.0)] * 2 and got["off"] == [pytest.approx(2.0)] * 2
    assert got["off_open"] == got["off_close"] == [pytest.approx(2.0)] * 2


def test_a_noise_row_is_stated_from_the_same_side_twice():
    assert common.successive([2.0, 4.0, 3.0]) == [2.0, 0.75]
    row = common.noise("g_noise_x_twice", [1.0, 0.98, 1.03, 1.01], "x twice")
    assert row["verdict"] == "stated" and row["target"] == "-" and row["meets"] is None
    assert row["details"]["summary"] == "x twice" and row["spread"] is not None


def test_follow_reads_only_what_was_appended(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    follow = common.Follow(metrics)
    assert follow() == -1  # no file yet
    metrics.write_text('{"step": 1, "time": 1.0}\n{"step": 2, "time": 2.0}\n{"step": 3')
    assert follow() == 2  # the cut line is not read
    with metrics.open("a") as f:
        f.write(', "time": 3.0}\n')
    assert follow() == 3
    assert follow.offset == metrics.stat().st_size


def test_recovery_reads_the_trainers_snapshot_line():
    from benchmarks import recovery

    assert "recovery" in harness.BENCHMARKS
    log = (
        "step 3\nsnapshots in memory every 2 step(s): 1.9 MiB per rank, 12.5 ms each, "
        "2% of a 400.0 ms step\n"
    )
    fig = recovery.trainer_figure(log)
    assert fig is not None and fig["every_steps"] == 2 and fig["mib_per_rank"] == 1.9
    assert fig["cost_per_step"] == pytest.approx(12.5 / (2 * 400.0))
    # recalibrated, the partner's copy on its own interval: the last line counts, both parts
    log += (
        "snapshots in memory every 1 step(s): 1.9 MiB per rank, 3.0 ms each, 2% of a 400.0 ms "
        "step; the partner's copy every 8 (20.0 ms each)\n"
    )
    fig = recovery.trainer_figure(log)
    assert fig is not None and (fig["every_steps"], fig["partner_every_steps"]) == (1, 8)
    assert fig["cost_per_step"] == pytest.approx(3.0 / 400.0 + 20.0 / (8 * 400.0))
    assert recovery.trainer_figure("no such line") is None
    text = "resumed from the in-memory snapshot of step 14 in 0.03s"
    assert recovery.LOADED.findall(text) == ["0.03"]


def _toggled(seg: int, start: int, drift: float) -> dict[int, float]:
    """Step times of a toggled run: 1.0 s a step, `drift` s more each step, 0.2 s more at each
    snapshot (every 2 steps) in the "on" segments (odd j)."""
    times, t = {}, 100.0
    for s in range(start, start + 17 * seg + 1):
        times[s] = t
        on = ((s - start) // seg) % 2 == 1  # the segment of step boundary s
        t += 1.0 + drift * (s - start) + (0.2 if on and s % 2 == 0 else 0.0)
    return times


def test_snapshot_cost_compares_on_segments_with_the_off_ones_around_them():
    from benchmarks.snapshot_cost import in_run_cost, in_run_per_rep, per_rep, segments

    seg, start = 4, 8
    d = segments(_toggled(seg, start, drift=0.01), seg, start)  # the machine slows steadily
    assert len(d) == 17
    ab, aa = per_rep(d, block=4)
    # each "on" segment holds 2 snapshots of 0.2 s: 4 of them hold 1.6 s more than 4 "off"
    # ones at the same moment; the drift cancels (a plain on/off would read it as cost)
    on = [sum(d[8 * r + 1 : 8 * r + 8 : 2]) for r in range(2)]
    assert ab == [pytest.approx(1.6 / (t - 1.6)) for t in on]
    assert aa == [pytest.approx(0.0, abs=1e-9)] * 2  # the two "off" sets share the moment
    times = _toggled(seg, start, drift=0.001)
    on = [start + j * seg for j in range(1, 17, 2)]
    assert in_run_cost(times, on, every=2, segment=seg) == pytest.approx(0.1, abs=0.01)
    reps = in_run_per_rep(times, start, seg, every=2, block=4, reps=2)
    assert len(reps) == 2 and all(0.09 < c < 0.11 for c in reps)  # 0.2 s over 2 ~1 s steps
    # a long tail (every third step 1.6 s) on both sides is no cost; a median on one side read 0.1
    tail, t = {0: 0.0}, 0.0
    for k in range(1, 49):
        t += 1.6 if k % 3 == 0 else 1.0
        tail[k] = t
    assert in_run_cost(tail, [0, 12, 24, 36], every=2, segment=12) == pytest.approx(0.0, abs=1e-9)
    assert segments({8: 0.0, 12: 1.0}, seg, start) == [1.0]  # a segment needs both ends
    # capped: a stall counts as at most `cap` seconds, on either side
    stalled = {s: float(s) for s in range(8, 17)}
    stalled = {s: t + (5.0 if s >= 10 else 0.0) for s, t in stalled.items()}  # step 10 took 6 s
    assert segments(stalled, seg, start) == [9.0, 4.0]
    assert segments(stalled, seg, start, cap=2.0) == [5.0, 4.0]
    assert segments({8: 0.0, 12: 1.0}, seg, start, cap=2.0) == []  # every step's time needed


def test_a_missing_piece_is_reported_not_measured(monkeypatch):
    monkeypatch.setitem(harness.BENCHMARKS, "ghost", "benchmarks.no_such_module")
    (row,) = harness.run_one("ghost", quick=True)
    assert set(row) == KEYS
    assert row["ratio"] is None and row["meets"] is False
    assert "no_such_module" in row["details"]["not_measured"]


def test_raw_write_baseline_writes_and_cleans_up(tmp_path):
    r = raw_write(3 * (8 << 20) + 123, tmp_path)
    assert r["bytes"] == 3 * (8 << 20) + 123 and r["write_s"] > 0 and r["read_s"] > 0
    assert list(tmp_path.iterdir()) == []


def test_run_writes_json_and_markdown(tmp_path):
    """A real quick run of the CLI benchmark through run.py, as `make bench-quick` runs it, with
    one repetition (a repetition is 6 timed process starts and a pair of callgrind runs, the
    slowest part: the rows' shape needs no more; `settle` over several repetitions is tested on
    its own above)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "run.py"),
            "--quick",
            "--only",
            "cli",
            "--reps",
            "1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    (js,) = tmp_path.glob("*.json")
    (md,) = tmp_path.glob("*.md")
    assert js.stem == md.stem and re.fullmatch(r"\d{4}-\d\d-\d\d-\d{4}-quick", js.stem), js
    rows = json.loads(js.read_text())
    assert [r["name"] for r in rows] == [
        "cli_submit_dry_run_vs_bare_imports",
        "cli_help_vs_bare_imports",
        "cli_profiles_list_vs_bare_imports",
        "cli_submit_dry_run_instructions_vs_bare_imports",
        "cli_render_4096_nodes_seconds",
    ]
    for r in rows:
        assert set(r) == KEYS
        assert isinstance(r["details"], dict) and r["details"]["machine"]["cores"] >= 1
        if r["ratio"] is None:
            assert r["verdict"] == "not measured" and r["details"]["not_measured"]
        else:
            lo, hi = r["spread"]
            assert lo <= r["ratio"] <= hi
            want = {(True, True): "met", (False, False): "missed"}.get(
                (common.check(lo, r["target"]), common.check(hi, r["target"])), "not settled"
            )
            assert r["verdict"] == want
        assert f"{r['name']}:" in p.stdout and r["verdict"] in p.stdout
    assert {r["details"]["group"] for r in rows} == {"cli"}
    assert all(r["details"]["group_s"] > 0 for r in rows)
    text = md.read_text()
    assert "| benchmark | median | spread | target | verdict | note |" in text
    assert "| group | rows | seconds | planned | CPU seconds | load average after |" in text
    assert "| cli | 5 |" in text  # quick mode: no plan
    assert "cores" in text and "torch" in text
    assert all(r["name"] in text for r in rows)


def test_bubble_fit_recovers_the_formula_from_pass_times():
    from benchmarks.parallel import fit_bubble

    assert "parallel" in harness.BENCHMARKS
    # an ideal pipeline of p = 4 stages: (m + p - 1) slots of 0.1 s each
    s, rows = fit_bubble({m: (m + 3) * 0.1 for m in (2, 4, 8)}, 4)
    assert s == pytest.approx(0.1)
    for m, row in rows.items():
        assert row["measured_idle"] == pytest.approx(3 / (m + 3), abs=1e-4) == row["formula"]
    # a fixed cost per pass (sends, schedule set-up) shows as more idle time than the formula
    _, slow = fit_bubble({m: (m + 3) * 0.1 + 0.05 for m in (2, 4, 8)}, 4)
    assert all(r["measured_idle"] > r["formula"] for r in slow.values())
