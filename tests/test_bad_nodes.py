"""Bad nodes without a cluster: the preflight gate's decisions on report files, its CLI, bisect,
the stall watchdog in one process, min_nodes rendering, the gate entering the launch's own container
(live faults: tests/test_bad_nodes_live.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.checks.preflight import gate
from hpctrain.kernel import jobenv

# --- the gate's decisions, from report files -----------------------------------------------


def _report(
    folder: Path, node: int, name: str, *, matmul_s: float = 0.01, fail: str | None = None
) -> None:
    checks = [
        {"name": "imports", "status": "pass", "detail": "torch"},
        {"name": "matmul", "status": "fail" if fail else "pass", "detail": fail or "exact"},
    ]
    (folder / f"node-{node}.json").write_text(
        json.dumps(
            {
                "node": node,
                "name": name,
                "ok": not fail,
                "checks": checks,
                "matmul_s": None if fail else matmul_s,
            }
        )
    )


def test_gate_names_failed_silent_broken_and_lagging_nodes(tmp_path):
    _report(tmp_path, 0, "a")
    _report(tmp_path, 1, "b", fail="cpu: 512x512 integer matmul is WRONG")
    (tmp_path / "fail-2.txt").write_text("1\nModuleNotFoundError: No module named 'hpctrain'\n")
    _report(tmp_path, 4, "e", matmul_s=0.05)  # 5x the others' median
    _report(tmp_path, 5, "f", matmul_s=0.012)
    good, bad, warnings, _ = gate.judge(
        tmp_path,
        ["a", "b", "c", "d", "e", "f"],
        budget_s=30,
        slow_factor=2.0,
        expected_busbw=None,
        min_fraction=0.5,
    )
    assert good == ["a", "f"]
    assert "matmul is WRONG" in bad["b"]
    assert "exit code 1" in bad["c"] and "No module named 'hpctrain'" in bad["c"]
    assert "no report within the 30 s budget" in bad["d"]
    assert bad["e"].startswith("lagging: matmul 50.0 ms is 4.5x the median")
    assert warnings == []


def test_gate_names_a_slow_link_only_with_three_nodes_or_more(tmp_path):
    for n, name in enumerate("abc"):
        _report(tmp_path, n, name)
    pairs = [
        {"a": 0, "b": 1, "seconds": 0.01},
        {"a": 1, "b": 2, "seconds": 0.05},
        {"a": 2, "b": 0, "seconds": 0.05},
    ]
    (tmp_path / "net.json").write_text(
        json.dumps(
            {
                "members": [0, 1, 2],
                "names": ["a", "b", "c"],
                "busbw_gbps": 1.0,
                "correct": True,
                "pairs": pairs,
            }
        )
    )
    good, bad, warnings, busbw = gate.judge(
        tmp_path,
        ["a", "b", "c"],
        budget_s=30,
        slow_factor=2.0,
        expected_busbw=10.0,
        min_fraction=0.5,
    )
    assert list(bad) == ["c"] and bad["c"].startswith("slow network")
    assert busbw == 1.0 and "below 0.5 x the expected 10 GB/s" in warnings[0]
    # two nodes: one link, nobody to blame; reported, not excluded
    two = tmp_path / "two"
    two.mkdir()
    for n, name in enumerate("ab"):
        _report(two, n, name)
    (two / "net.json").write_text(
        json.dumps(
            {
                "members": [0, 1],
                "names": ["a", "b"],
                "busbw_gbps": 1.0,
                "correct": True,
                "pairs": [],
            }
        )
    )
    good, bad, warnings, _ = gate.judge(
        two, ["a", "b"], budget_s=30, slow_factor=2.0, expected_busbw=10.0, min_fraction=0.5
    )
    assert good == ["a", "b"] and not bad and "doctor --bisect" in warnings[0]


def test_gate_goes_on_when_no_node_could_report_in_time():
    bad = {n: f"{gate.NO_REPORT} the 40 s budget" for n in ("n1", "n2")}
    good, left, warnings = gate.all_silent(["n1", "n2"], [], bad, [])
    assert good == ["n1", "n2"] and left == {} and "raise preflight.budget_s" in warnings[0]
    bad["n2"] = "imports: import torch failed"  # a real finding: nothing is waved through
    assert gate.all_silent(["n1", "n2"], [], bad, [])[1] == bad


def test_gate_decides_shrink_requeue_or_fail():
    bad = {"n2": "x"}
    assert (
        gate.decide(["n1", "n2"], {}, min_nodes=2, on_fail="shrink", can_requeue=True, excluded=[])[
            0
        ]
        == "ok"
    )
    assert (
        gate.decide(["n1"], bad, min_nodes=1, on_fail="shrink", can_requeue=True, excluded=[])[0]
        == "shrink"
    )
    action, reason, exclude = gate.decide(
        ["n1"], bad, min_nodes=2, on_fail="shrink", can_requeue=True, excluded=["n7"]
    )
    assert action == "requeue" and exclude == ["n2", "n7"] and "n2 (x)" in reason
    assert (
        gate.decide(["n1"], bad, min_nodes=1, on_fail="requeue", can_requeue=True, excluded=[])[0]
        == "requeue"
    )
    assert (
        gate.decide(["n1"], bad, min_nodes=2, on_fail="shrink", can_requeue=False, excluded=[])[0]
        == "fail"
    )
    action, reason, _ = gate.decide(
        [], {"n1": "x", "n2": "y"}, min_nodes=1, on_fail="shrink", can_requeue=True, excluded=[]
    )
    assert action == "fail" and "the environment or the profile" in reason
    # a requeue without n2 on a 2-node partition for a 2-node job could never start (Slurm kept
    # such a job PENDING, BadConstraints, for good): it fails and says so
    action, reason, exclude = gate.decide(
        ["n1"],
        bad,
        min_nodes=2,
        on_fail="shrink",
        can_requeue=True,
        excluded=[],
        partition=["n1", "n2"],
    )
    assert action == "fail" and exclude == ["n2"], reason
    assert "the partition has 1 node(s) for a job of at least 2" in reason and "fix:" in reason
    three = ["n1", "n2", "n3"]
    assert (
        gate.decide(
            ["n1"],
            bad,
            min_nodes=2,
            on_fail="requeue",
            can_requeue=True,
            excluded=[],
            partition=three,
        )[0]
        == "requeue"
    )
    upd = gate.requeue_update(["n2"], {"ExcNodeList": ["n7"], "ReqNodeList": ["n1", "n2"]}, 1, 2)
    assert upd == ["ExcNodeList=n2,n7", "ReqNodeList=n1", "NumNodes=1-2"]


def test_gate_cli_prints_shell_and_writes_the_event(tmp_path):
    folder = tmp_path / "preflight" / "7-0"
    folder.mkdir(parents=True)
    _report(folder, 0, "n1")
    (folder / "fail-1.txt").write_text("127\nbash: /x/bin/python: No such file or directory\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain.checks.preflight.gate",
            str(folder),
            "--nodes",
            "n1,n2",
            "--run-dir",
            str(tmp_path),
            "--min-nodes",
            "1",
            "--max-nodes",
            "2",
            "--job-id",
            "",
            "--restart-count",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "hpctrain_gate=shrink\nhpctrain_good=n1\nhpctrain_bad=n2\n" in out.stdout
    assert "node n2 failed: the preflight checks could not run (exit code 127)" in out.stderr
    ev = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert ev[0]["event"] == "preflight" and ev[0]["verdict"] == "shrink"
    assert "No such file or directory" in ev[0]["bad"]["n2"]
    assert json.loads((tmp_path / "preflight.json").read_text())["bad"] == ev[0]["bad"]


def test_bisect_halves_to_the_node_that_breaks_a_set():
    from hpctrain.checks.preflight.bisect import Probe, bisect

    nodes = [f"n{i}" for i in range(1, 9)]
    seen = []

    def probe(sub):  # n6 breaks every set it is in, without failing alone in a way the gate names
        seen.append(sub)
        return Probe(
            sub, "n6" not in sub, warnings=[] if "n6" not in sub else ["all-reduce below expected"]
        )

    b = bisect(nodes, probe)
    assert b.exclude == "n6" and "below expected" in b.bad["n6"]
    assert len(seen) <= 1 + 2 * 3  # log2(8) halvings, at most two probes each
    # a fault only between the halves: both are reported
    b = bisect(["a", "b"], lambda sub: Probe(sub, len(sub) == 1, warnings=["slow"]))
    assert sorted(b.bad) == ["a", "b"] and "between the halves" in b.note
    # the gate names the node on the first probe: no halving needed
    b = bisect(nodes, lambda sub: Probe(sub, False, bad={"n3": "import torch failed"}))
    assert b.bad == {"n3": "import torch failed"} and len(b.probes) == 1


def test_the_stall_watchdog_dumps_marks_and_exits(tmp_path):
    """A process that stops beating: its stack (with the function it hangs in), STALLED, the event,
    exit 76. The same thread every train_entry rank runs (the live stall test runs it for real)."""
    code = f"""
import time
from train_entry.watchdog import Watchdog
w = Watchdog({str(tmp_path)!r}, rank=3, stall_s=1.0).start()
w.beat(41)
def stuck_in_here():
    time.sleep(60)
stuck_in_here()
"""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 76, out.stderr
    assert time.monotonic() - t0 < 30
    marker = json.loads((tmp_path / "STALLED").read_text())
    assert marker["rank"] == 3 and marker["last_step"] == 41
    dump = (Path(marker["stacks"]) / "rank-3.txt").read_text()
    assert "no step for" in dump and "stuck_in_here" in dump
    ev = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert ev[0]["event"] == "stall" and ev[0]["rank"] == 3


def test_min_nodes_renders_a_range_for_every_strategy(tmp_path):
    from hpctrain.jobs.request import JobRequest
    from hpctrain.jobs.spec import JobSpec
    from hpctrain.kernel.errors import ValidationError
    from hpctrain.profiles import resolve
    from hpctrain.render.script import render

    profile = resolve("loopback", {"preflight.enabled": True})
    req = JobRequest.build(profile, name="r", nodes=2, gpus=1, min_nodes=1, exclude=["n7,n9"])
    text = render(JobSpec.build(profile, req, tmp_path / "r"))
    assert "#SBATCH --nodes=1-2\n" in text and "--ntasks-per-node=1\n#" not in text
    assert "#SBATCH --exclude=n7,n9\n" in text
    assert f"{jobenv.NNODES}=$SLURM_NNODES" in text and "  hpctrain_preflight\n" in text
    # DeepSpeed continues on fewer nodes too (its universal checkpoint: tests/test_resize.py)
    JobRequest.build(profile, name="r", nodes=2, gpus=1, min_nodes=1, strategy="deepspeed")
    with pytest.raises(ValidationError, match="--min-nodes 3: between 1 and --nodes"):
        JobRequest.build(profile, name="r", nodes=2, gpus=1, min_nodes=3)


# --- the gate runs in the launch's own container -------------------------------------------


def _gate_and_launch(flags: dict) -> tuple[list[str], str]:
    from hpctrain.jobs.request import JobRequest
    from hpctrain.jobs.spec import JobSpec
    from hpctrain.profiles import resolve
    from hpctrain.render.script import render

    profile = resolve("loopback", {"preflight.enabled": True, **flags})
    req = JobRequest.build(profile, name="t", nodes=1)
    text = render(JobSpec.build(profile, req, "/tmp/runs/t"))
    check = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("check+=(")]
    launch = next(ln for ln in text.splitlines() if "# environment.container" in ln)
    return check, launch.split("+=", 1)[1].split("  #")[0]


@pytest.mark.parametrize(
    "flags",
    [
        {"environment.container.kind": "pyxis", "environment.container.image": "$IMG"},
        {
            "environment.container.kind": "singularity",
            "environment.container.image": "/x.sif",
            "environment.container.binary": "/opt/s/bin/singularity",
            "slurm.gpus_per_node": 4,
        },
        {"environment.container.kind": "shifter", "environment.container.image": "docker:a/b:1"},
        {"environment.container.kind": "edf", "environment.container.image": "my-env"},
    ],
)
def test_the_preflight_gate_enters_the_same_container_as_the_launch(tmp_path, monkeypatch, flags):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    monkeypatch.setenv(jobenv.PYTHON, "/opt/py/bin/python")
    check, launch = _gate_and_launch(flags)
    assert f"check+={launch}" in check, (check, launch)
    assert not any("apptainer" in c for c in check)  # before: every kind but pyxis
    if flags["environment.container.kind"] == "pyxis":
        assert '--container-image="$IMG"' in launch  # expands on the node, never quoted literally
    if flags["environment.container.kind"] == "singularity":
        assert launch.startswith('("/opt/s/bin/singularity" exec --nv ')


def test_golden_gate(tmp_path, monkeypatch):
    """The loopback golden request with the gate on (the loopback profile has it off: every live
    test job paid seconds for it). Refresh after an intended change: make golden."""
    from test_render import GOLDEN, GOLDEN_PYTHON, golden_script, shellcheck

    # as test_render's golden tests: the render depends only on the repository
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    monkeypatch.setenv(jobenv.PYTHON, GOLDEN_PYTHON)

    text, path = (
        golden_script("loopback", **{"preflight.enabled": True}),
        GOLDEN / "gate" / "loopback.sh",
    )
    if os.environ.get(jobenv.UPDATE_GOLDEN):
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs: review, then make golden"
    assert "  hpctrain_preflight\n" in text and "hpctrain.checks.preflight.gate" in text
    shellcheck(path)
