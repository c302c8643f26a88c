"""Hot spares (`preemption.spare_nodes`, `submit --spare-nodes`; issue 24 item 2) without a cluster:
the key and its checks, the rendered allocation (golden), the gate's placement, and the batch
script's swap loop run with stand-ins at the subprocess boundary (srun, scontrol, getent and the
node python; the gate's verdict is the real one). Live on the three-node loopback cluster:
tests/test_spares_live.py.

    .venv/bin/pytest -q tests/test_spares.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctrain.checks.preflight import gate
from hpctrain.jobs.request import JobRequest
from hpctrain.jobs.spec import JobSpec
from hpctrain.kernel import jobenv, layout
from hpctrain.kernel.errors import ValidationError
from hpctrain.profiles import resolve
from hpctrain.render.script import render
from hpctrain.runs import spares

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden" / "spares"


def lines(path: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except OSError:
        return []


# ---------------------------------------------------------------- the key and its checks


def test_the_key_defaults_to_0_and_is_validated():
    assert resolve("loopback", {}).preemption.spare_nodes == 0
    assert resolve("loopback", {"preemption.spare_nodes": 1}).preemption.spare_nodes == 1
    for bad in (-1, 65):
        with pytest.raises(Exception, match="spare_nodes"):
            resolve("loopback", {"preemption.spare_nodes": bad})


def test_spares_are_for_slurm_and_count_against_max_nodes():
    local = resolve("local", {"preemption.spare_nodes": 1})
    with pytest.raises(ValidationError, match="hot spares are nodes of a Slurm allocation"):
        JobRequest.build(local, name="s", nodes=2, gpus=1)
    loop = resolve("loopback", {"preemption.spare_nodes": 2})  # max_nodes 3
    with pytest.raises(ValidationError, match=r"--nodes 2 \+ --spare-nodes 2 = 4 nodes"):
        JobRequest.build(loop, name="s", nodes=2, gpus=1)
    req = JobRequest.build(resolve("loopback", {"preemption.spare_nodes": 1}), name="s", nodes=2)
    assert req.allocated(resolve("loopback", {"preemption.spare_nodes": 1})) == 3


# ---------------------------------------------------------------- rendering


def spare_script(launcher: str = "torchrun", **flags: object) -> str:
    profile = resolve(
        "loopback",
        {"storage.runs_dir": "/scratch/runs", "preemption.spare_nodes": 1,
         "launch.launcher": launcher, "preflight.enabled": True, **flags},
    )  # fmt: skip
    req = JobRequest.build(profile, name="golden", nodes=2, args=["--max-steps", "10"])
    return render(
        JobSpec.build(profile, req, "/scratch/runs/golden", python="/opt/hpctrain/bin/python")
    )


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_golden_spares(launcher):
    """The loopback golden request with one spare: the allocation, the swap loop, both launchers.
    Refresh after an intended change: make golden."""
    text = spare_script(launcher)
    path = GOLDEN / f"loopback-{launcher}.sh"
    if os.environ.get(jobenv.UPDATE_GOLDEN):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden: make golden ({jobenv.UPDATE_GOLDEN}=1 pytest {__file__})"
    assert text == path.read_text(), f"{path} differs: review, then make golden"
    subprocess.run(["bash", "-n"], input=text, text=True, check=True, timeout=30)
    from test_render import shellcheck

    shellcheck(path)


def test_the_allocation_holds_the_spares_and_training_gets_its_node_list():
    text = spare_script()
    assert "#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=1\n" in text
    assert f"export {jobenv.NNODES}=2\n" in text  # training nodes: the topology is unchanged
    assert 'if [ "${SLURM_NNODES:-}" != 3 ]; then' in text
    assert f'--ntasks="$(({jobenv.NNODES} * 1))"' in text
    assert '/training.txt" "$hpctrain_nodes"\n' in text  # the node list by a file (issue 37)
    assert '"@$dir/train.args" --spare-nodes 1' in text
    srun = spare_script("srun")
    assert f'--ntasks="$(({jobenv.NNODES} * 2))"' in srun
    assert '[ "$hpctrain_tries" -ge 2 ]' in srun  # a swap spends no in-job restart
    # --min-nodes: a range of allocations, spares on top; training gets what came less the spares
    profile = resolve("loopback", {"preemption.spare_nodes": 1})
    req = JobRequest.build(profile, name="r", nodes=2, gpus=1, min_nodes=1)
    ranged = render(JobSpec.build(profile, req, "/scratch/runs/r"))
    assert "#SBATCH --nodes=2-3\n" in ranged
    assert f"{jobenv.NNODES}=$((SLURM_NNODES - 1))" in ranged


def test_no_spares_renders_as_before():
    from test_render import GOLDEN as GOLDEN_DIR

    text = spare_script(**{"preemption.spare_nodes": 0, "preflight.enabled": False})
    assert text == (GOLDEN_DIR / "loopback.sh").read_text()


def test_cli_dry_run_and_render_show_the_spares(tmp_path, monkeypatch):
    from hpctrain.cli import main

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    common = ["--profile", "loopback", "--nodes", "2", "--spare-nodes", "1", "--name", "sp"]
    out = runner.invoke(main, ["render", *common, "--", "--max-steps", "10"])
    assert out.exit_code == 0, out.output
    assert "#SBATCH --nodes=3\n" in out.output
    dry = runner.invoke(main, ["submit", *common, "--dry-run", "--", "--max-steps", "10"])
    assert dry.exit_code == 0, dry.output
    assert "topology: 2 node(s) x 2 GPU(s) + 1 hot spare node(s)" in dry.output
    assert "swapped for one of 1 hot spare(s)" in dry.output
    bad = runner.invoke(main, ["render", *common[:-2], "--spare-nodes", "2", "--name", "x"])
    assert bad.exit_code != 0 and "--spare-nodes 2 = 4 nodes" in bad.output


# ---------------------------------------------------------------- the gate's placement


def test_place_swaps_bad_training_nodes_for_good_spares_in_order():
    p = gate.place(["n1", "n2", "n3", "n4"], ["n1", "n2"], ["n3", "n4"], {"n1": "x", "n3": "y"})
    assert (p.train, p.spares_left, p.swapped, p.short) == (["n2", "n4"], [], [("n1", "n4")], [])
    short = gate.place(["n1", "n2", "n3"], ["n1", "n2"], ["n3"], {"n1": "x", "n2": "y"})
    assert short.train == ["n3"] and short.short == ["n2"] and short.swapped == [("n1", "n3")]


def _report(folder: Path, node: int, name: str, fail: str | None = None) -> None:
    if fail:
        (folder / f"fail-{node}.txt").write_text(f"1\n{fail}\n")
        return
    checks = [{"name": "imports", "status": "pass", "detail": "torch"}]
    (folder / f"node-{node}.json").write_text(
        json.dumps({"node": node, "name": name, "ok": True, "checks": checks, "matmul_s": 0.01})
    )


def _gate(tmp_path: Path, names: list[str], bad: set[str], *extra: str) -> tuple[str, Path]:
    folder = tmp_path / "preflight" / "7-0-1"
    folder.mkdir(parents=True)
    for i, n in enumerate(names):
        _report(
            folder, i, n, "ModuleNotFoundError: No module named 'hpctrain'" if n in bad else None
        )
    out = subprocess.run(
        [sys.executable, "-m", "hpctrain.checks.preflight.gate", str(folder),
         "--nodes", ",".join(names), "--run-dir", str(tmp_path), "--min-nodes", "2",
         "--max-nodes", "2", "--job-id", "", "--restart-count", "0", *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout, folder


def test_gate_swaps_a_bad_node_for_the_spare_and_writes_the_event(tmp_path):
    out, _ = _gate(
        tmp_path, ["n1", "n2", "n3"], {"n2"}, "--train", "n1,n2", "--spare-nodes", "1",
        "--when", "training",
    )  # fmt: skip
    assert "hpctrain_gate=swap\n" in out and "hpctrain_train=n1,n3\n" in out, out
    assert "hpctrain_spares_left=''\n" in out
    ev = lines(tmp_path / layout.EVENTS)
    assert [e["event"] for e in ev] == ["preflight", "spare_swapped"], ev
    sw = ev[1]
    assert (sw["out"], sw["in"], sw["spares_left"], sw["when"]) == ("n2", "n3", 0, "training")
    assert "No module named 'hpctrain'" in sw["reason"] and sw["nodes"] == ["n1", "n3"]


def test_gate_drops_a_bad_spare_and_goes_on(tmp_path):
    out, _ = _gate(tmp_path, ["n1", "n2", "n3"], {"n3"}, "--train", "n1,n2", "--spare-nodes", "1")
    assert "hpctrain_gate=ok\n" in out and "hpctrain_train=n1,n2\n" in out, out
    assert "hpctrain_spares_left=''\n" in out
    assert "spare_swapped" not in (tmp_path / layout.EVENTS).read_text()


def test_gate_with_no_spare_left_takes_the_usual_path(tmp_path):
    """The spare is used up: a second bad node cannot shrink a 2-node run (no --min-nodes), so the
    job excludes it and requeues, asking for its spare again (NumNodes counts it)."""
    out, folder = _gate(
        tmp_path, ["n1", "n3"], {"n1"}, "--train", "n1,n3", "--spare-nodes", "1",
        "--when", "training",
    )  # fmt: skip
    assert "hpctrain_gate=requeue\n" in out, out
    assert "hpctrain_update=(ExcNodeList=n1 NumNodes=3-3)" in out
    assert json.loads((folder / "verdict.json").read_text())["action"] == "requeue"


# ---------------------------------------------------------------- the batch script, stand-ins

NODE_PYTHON = f"""#!{sys.executable}
# Stand-in node python. The preflight node checks fail on a node named in $RECORD/bad (as a
# hidden site-packages would); the gate's verdict and `-c` run for real; training records its
# step and, on FAIL_NODE's first step, makes that node bad and dies.
import json, os, sys
real = {sys.executable!r}
if sys.argv[1:2] == ["-c"] or sys.argv[1:3] == ["-m", "hpctrain.checks.preflight.gate"]:
    os.execv(real, [real, *sys.argv[1:]])
rec = os.environ["RECORD"]
name = os.environ.get("SLURMD_NODENAME", "?")
bad = set(open(os.path.join(rec, "bad")).read().split()) if os.path.exists(os.path.join(rec, "bad")) else set()
if sys.argv[1:3] == ["-m", "hpctrain.checks.preflight.node"]:
    out, node = sys.argv[sys.argv.index("--out") + 1], os.environ["SLURM_NODEID"]
    with open(os.path.join(rec, "node.calls"), "a") as f:  # which checks: full or reduced
        f.write(os.path.basename(out) + " " + sys.argv[sys.argv.index("--when") + 1] + "\\n")
    if name in bad:
        print("ModuleNotFoundError: No module named 'hpctrain'", file=sys.stderr)
        sys.exit(1)
    checks = [{{"name": "imports", "status": "pass", "detail": "stand-in"}}]
    with open(os.path.join(out, f"node-{{node}}.json"), "w") as f:
        json.dump({{"node": int(node), "name": name, "ok": True, "checks": checks, "matmul_s": 0.01}}, f)
    sys.exit(0)
step = int(os.environ[{jobenv.IN_JOB_RESTART!r}])
with open(os.path.join(rec, "steps.jsonl"), "a") as f:
    f.write(json.dumps({{"step": step, "node": name, "nodeid": os.environ["SLURM_NODEID"],
                        "endpoint": os.environ[{jobenv.RDZV_ENDPOINT!r}]}}) + "\\n")
fail = os.environ.get("FAIL_NODES", "").split(",")
if step < len(fail) and fail[step] == name:
    if not os.environ.get("KEEP_GOOD"):
        with open(os.path.join(rec, "bad"), "a") as f:
            f.write(name + "\\n")
    sys.exit(137)
sys.exit(0)
"""
SRUN = """#!/bin/bash
# Stand-in srun: one line of options per call; runs the command once per node of --nodelist (else the job's),
# with SLURM_NODEID and SLURMD_NODENAME set, and exits with the worst task's status.
nodes=$SLURM_JOB_NODELIST
opts=()
while [ "${1#-}" != "$1" ]; do
  case $1 in
    --nodelist=*/*) nodes=$(paste -sd, "${1#--nodelist=}"); opts+=("--nodelist=$nodes") ;;  # a file's names
    --nodelist=*) nodes=${1#--nodelist=}; opts+=("$1") ;;
    *) opts+=("$1") ;;
  esac
  shift
done
echo "${opts[*]}" >>"$RECORD/srun.calls"
pids=(); i=0
for n in ${nodes//,/ }; do SLURM_NODEID=$i SLURMD_NODENAME=$n "$@" & pids+=($!); i=$((i + 1)); done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc
"""
SCONTROL = """#!/bin/bash
echo "$*" >>"$RECORD/scontrol.calls"
if [ "$1 $2" = "show hostnames" ]; then tr ',' '\\n' <<<"${3:-$SLURM_JOB_NODELIST}"; fi
exit 0
"""
GETENT = """#!/bin/bash
echo "127.0.0.1 STREAM $2"
"""
JOB_ENV = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "3", "SLURM_JOB_NODELIST": "n1,n2,n3"}


def run_job(tmp_path: Path, fail_nodes: str, bad: str = "", keep_good: str = "", **flags: object):
    bin_, rec = tmp_path / "bin", tmp_path / "record"
    bin_.mkdir(parents=True)
    rec.mkdir()
    for name, text in (("python", NODE_PYTHON), ("srun", SRUN), ("scontrol", SCONTROL),
                       ("getent", GETENT)):  # fmt: skip
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    if bad:
        (rec / "bad").write_text(bad + "\n")
    run_dir = tmp_path / "runs" / "s"
    run_dir.mkdir(parents=True)
    profile = resolve("loopback", {"preemption.spare_nodes": 1, "preflight.enabled": True, **flags})
    req = JobRequest.build(profile, name="s", nodes=2, gpus=1, args=[])
    text = render(JobSpec.build(profile, req, run_dir, python=str(bin_ / "python")))
    (tmp_path / "job.sh").write_text(text)
    env = {
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "RECORD": str(rec),
        "HOME": str(tmp_path),
        "FAIL_NODES": fail_nodes,
        "KEEP_GOOD": keep_good,
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
        **JOB_ENV,
    }
    out = subprocess.run(
        ["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    calls = (rec / "srun.calls").read_text().splitlines()
    return out, run_dir, calls, lines(rec / "steps.jsonl")


def nodelists(calls: list[str]) -> list[str]:
    return [next(w for w in c.split() if w.startswith("--nodelist=")).split("=")[1] for c in calls]


def test_a_node_that_fails_in_training_is_swapped_for_the_spare_in_the_same_job(tmp_path):
    """n2 dies in the first step and its checks then fail: the gate (training nodes and spare)
    swaps n3 in, and a second step trains on n1,n3 as an in-job restart; no requeue."""
    out, run_dir, calls, steps = run_job(tmp_path, fail_nodes="n2")
    assert out.returncode == 0, out.stdout + out.stderr
    # the start gate on all three, step 1 on n1,n2, the gate on n1,n2,n3, step 2 on n1,n3
    assert nodelists(calls) == ["n1,n2,n3", "n1,n2", "n1,n2,n3", "n1,n3"], calls
    assert sorted((s["step"], s["node"]) for s in steps) == [
        (0, "n1"),
        (0, "n2"),
        (1, "n1"),
        (1, "n3"),
    ]
    assert {s["endpoint"] for s in steps if s["step"] == 1} == {
        next(s["endpoint"] for s in steps if s["step"] == 1)
    }  # one rendezvous for the new step
    events = lines(run_dir / layout.EVENTS)
    assert [e["event"] for e in events] == ["preflight", "spare_swapped", "done"], events
    sw = events[1]
    assert (sw["out"], sw["in"], sw["spares_left"], sw["when"]) == ("n2", "n3", 0, "training")
    assert len(lines(run_dir / layout.RESTARTS)) == 1  # one start of the script: no requeue
    assert (run_dir / "preflight" / "4242-0-1" / "verdict.json").is_file()
    # the start gate's full checks, then the reduced ones after the failed step (node.py)
    whens = sorted(set((tmp_path / "record" / "node.calls").read_text().splitlines()))
    assert whens == ["4242-0 start", "4242-0-1 training"], whens
    assert "training starts again on n1,n3 (spares left: none)" in out.stdout
    info = spares.summary(
        events, asked=1, newest_start=lines(run_dir / layout.RESTARTS)[-1],
        verdict=json.loads((run_dir / layout.PREFLIGHT_LATEST).read_text()),
    )  # fmt: skip
    assert info.left == 0 and info.swaps[0].out == "n2", info
    assert "spare swap: n2 out, n3 in, after a failed training step" in "\n".join(
        spares.lines(info)
    )


def test_a_bad_node_at_the_start_is_swapped_and_the_head_moves(tmp_path):
    """The start gate finds n1 (the first node, the rendezvous head) bad: training starts on n2,n3
    with n2 as the head; no requeue."""
    out, run_dir, calls, steps = run_job(tmp_path, fail_nodes="", bad="n1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert nodelists(calls) == ["n1,n2,n3", "n2,n3"], calls
    assert {(s["node"], s["nodeid"]) for s in steps} == {("n2", "0"), ("n3", "1")}  # n2: the head
    events = lines(run_dir / layout.EVENTS)
    assert [e["event"] for e in events] == ["preflight", "spare_swapped", "done"], events
    assert events[1]["when"] == "start" and events[1]["in"] == "n3"


def test_with_no_spare_left_a_second_bad_node_excludes_and_requeues(tmp_path):
    """n2 then n1 die: the first swap uses the spare; the second finds no spare and takes the
    gate's usual path (no --min-nodes: exclude n1 and requeue, asking for 3 nodes again)."""
    out, run_dir, calls, _ = run_job(tmp_path, fail_nodes="n2,n1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert nodelists(calls) == ["n1,n2,n3", "n1,n2", "n1,n2,n3", "n1,n3", "n1,n3"], calls
    events = lines(run_dir / layout.EVENTS)
    names = [e["event"] for e in events]
    assert names == ["preflight", "spare_swapped", "preflight", "requeue"], events
    scontrol = (tmp_path / "record" / "scontrol.calls").read_text()
    assert "requeue 4242" in scontrol and "ExcNodeList=n1 NumNodes=3-3" in scontrol


def test_a_failure_the_gate_does_not_confirm_is_no_swap(tmp_path):
    """A worker dies but every node then passes its checks: no node to blame, no swap. torchrun
    (which restarted its workers itself) ends FAILED as without spares; launcher srun spends an
    in-job restart on the same nodes."""
    out, run_dir, calls, _ = run_job(tmp_path / "t", fail_nodes="n2", keep_good="1")
    assert out.returncode == 137, out.stdout + out.stderr
    assert nodelists(calls) == ["n1,n2,n3", "n1,n2", "n1,n2,n3"], calls
    assert [e["event"] for e in lines(run_dir / layout.EVENTS)] == ["failed"]
    out, run_dir, calls, steps = run_job(
        tmp_path / "s", fail_nodes="n2", keep_good="1", **{"launch.launcher": "srun"}
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert nodelists(calls) == ["n1,n2,n3", "n1,n2", "n1,n2,n3", "n1,n2"], calls
    assert "in-job restart 1 of 2, a new srun step" in out.stdout
    assert [e["event"] for e in lines(run_dir / layout.EVENTS)] == ["done"]


def test_without_a_start_gate_the_check_after_a_failed_step_is_the_full_one(tmp_path):
    """preflight.enabled false: no start gate ran, so the check after the failed step may not
    skip what the start gate would have checked (the spare's entry was never imported)."""
    out, run_dir, calls, _ = run_job(tmp_path, fail_nodes="n2", **{"preflight.enabled": False})
    assert out.returncode == 0, out.stdout + out.stderr
    assert nodelists(calls) == ["n1,n2", "n1,n2,n3", "n1,n3"], calls
    whens = sorted(set((tmp_path / "record" / "node.calls").read_text().splitlines()))
    assert whens == ["4242-0-1 start"], whens
