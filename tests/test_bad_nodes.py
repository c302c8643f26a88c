"""Bad nodes, live on the loopback cluster: a real fault made inside one node's own mount namespace,
the preflight gate naming it, the job routing around it (exclude + requeue, and shrink), and a rank
that stops stepping (stacks dumped, requeued, resumed). Plus the gate's decisions on report files.

    sudo .venv/bin/python -m pytest -m slurm tests/test_bad_nodes.py

The fault: the job runs a per-test Python environment (a venv whose site-packages holds one .pth
that adds the project's real site-packages); on n2 only, an empty folder is bind-mounted over that
per-test site-packages with `nsenter -t <n2's slurmd> -m`, so on n2 `python -m hpctrain...` fails
with ModuleNotFoundError while n1 is fine. Nothing another test or engineer uses is hidden, and the
mount is always undone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from hpctrain.kernel import jobenv
from hpctrain.preflight import gate

REPO = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get(jobenv.SLURM_STATE) or REPO / "tests" / "slurm" / ".state")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}
# 1 rank per node; global batch 8 = world x micro x accum at world 1 and 2 alike
TRAIN = [
    "--train.micro_batch=4",
    "--train.global_batch=8",
    "--train.log_every=1",
    "--model.d_model=64",
    "--model.n_layers=2",
    "--model.seq_len=32",
]


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
            "hpctrain.preflight.gate",
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


# --- live: a real fault on n2 ---------------------------------------------------------------


def _slurmd_pid(node: str) -> int:
    pid = int((STATE / "run" / f"slurmd-{node}.pid").read_text().strip())
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "slurmd"
    return pid


def per_test_python(root: Path) -> Path:
    """A venv of our own whose site-packages is a real folder holding one .pth to the real one."""
    venv = root / "pyenv"
    site = (
        venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    )
    site.mkdir(parents=True)
    (venv / "bin").mkdir()
    real = Path(os.path.realpath(sys.executable))
    (venv / "bin" / "python").symlink_to(real)
    shutil.copy(Path(sys.prefix) / "pyvenv.cfg", venv / "pyvenv.cfg")
    (site / "shared.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
    )
    return venv / "bin" / "python"


@contextlib.contextmanager
def hidden_on(node: str, path: Path, empty: Path):
    """Bind-mount `empty` over `path` inside `node`'s mount namespace only; always undone."""
    assert path.is_dir() and not path.is_symlink() and os.path.realpath(path) == str(path), path
    pid = _slurmd_pid(node)
    empty.mkdir(exist_ok=True)
    subprocess.run(
        ["nsenter", "-t", str(pid), "-m", "mount", "--bind", str(empty), str(path)],
        check=True,
        timeout=30,
    )
    try:
        yield
    finally:
        subprocess.run(
            ["nsenter", "-t", str(pid), "-m", "umount", str(path)], check=True, timeout=30
        )


def _lines(path: Path) -> list[dict]:
    return (
        [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if path.is_file()
        else []
    )


class Live:
    def __init__(self, root: Path, python: Path) -> None:
        self.root, self.python = root, python
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "XDG_CONFIG_HOME": str(root / ".config")}

    def hp(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        out = subprocess.run(
            [str(self.python), "-m", "hpctrain", *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert out.returncode == 0, (
            f"hpctrain {' '.join(args)} -> {out.returncode}\n{out.stdout}\n{out.stderr}"
        )
        return out

    def wait(self, name: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            info = json.loads(self.hp("status", name, "--json").stdout)
            if info["state"] in ENDED:
                return info
            assert time.monotonic() < deadline, f"{name}: still {info['state']} after {timeout} s"
            time.sleep(2)

    def dump(self) -> None:
        for run in sorted((self.root / "runs").glob("*")):
            for f in [
                run / "events.jsonl",
                run / "restarts.jsonl",
                run / "train.log",
                *sorted((run / "logs").glob("*.log")),
                *sorted(run.glob("preflight/*/*")),
            ]:
                if f.is_file():
                    print(f"==> {f} <==\n{f.read_text(errors='replace')[-4000:]}")


@pytest.fixture
def live(slurm_cluster, tmp_path, request):
    lv = Live(tmp_path, per_test_python(tmp_path))
    yield lv
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        lv.dump()
    for jobs in (tmp_path / "runs").glob("*/jobs.jsonl"):
        for job in _lines(jobs):
            subprocess.run(["scancel", str(job["job_id"])], capture_output=True, timeout=30)


def reference(root: Path, nproc: int, args: list[str]) -> str:
    """The uninterrupted run at `nproc` ranks on this machine: its final parameters' hash."""
    run = root / f"ref-{nproc}"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            "train_entry",
            "--run-dir",
            str(run),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return (run / "final_params.sha256").read_text()


@pytest.mark.slurm
@pytest.mark.timeout(480)
def test_gate_names_a_broken_node_and_the_run_routes_around_it(live):
    """n2's Python environment is broken. Two runs of --nodes 2 --min-nodes 1, forced onto n1,n2:
    `requeue` names n2, excludes it and requeues (the restart gets n1 only); `shrink` continues at
    once on n1. Both complete on n1 and end bit-identical to an uninterrupted 1-rank run."""
    args = [*TRAIN, "--max-steps=6", "--checkpoint-every=3"]
    site = (
        live.python.parent.parent
        / "lib"
        / f"python{sys.version_info.major}.{sys.version_info.minor}"
        / "site-packages"
    )
    profile = live.root / "badnodes.yaml"
    profile.write_text(
        "name: badnodes\nextends: loopback\nslurm:\n  extra_sbatch: ['--nodelist=n1,n2']\n"
        "preflight:\n  enabled: true\n  budget_s: 60\n  matmul_n: 512\n  allreduce_mib: 4\n"
    )
    with hidden_on("n2", site, live.root / "empty"):
        # the fault is real and only on n2
        probe = [str(live.python), "-c", "import hpctrain"]
        assert (
            subprocess.run(
                ["nsenter", "-t", str(_slurmd_pid("n2")), "-m", *probe],
                capture_output=True,
                timeout=60,
            ).returncode
            != 0
        )
        assert (
            subprocess.run(
                ["nsenter", "-t", str(_slurmd_pid("n1")), "-m", *probe],
                capture_output=True,
                timeout=60,
            ).returncode
            == 0
        )
        for name, mode in (("requeue", "requeue"), ("shrink", "shrink")):
            live.hp(
                "submit",
                "--profile",
                str(profile),
                "--nodes",
                "2",
                "--min-nodes",
                "1",
                "--gpus",
                "1",
                "--set",
                f"preflight.on_fail={mode}",
                "--name",
                name,
                "--",
                *args,
            )
        want = reference(live.root, 1, args)
        infos = {name: live.wait(name, 300) for name in ("requeue", "shrink")}
        # doctor --bisect over the shrink run's nodes (n1, n2) names n2 and prints the exclude list
        bis = subprocess.run(
            [
                str(live.python),
                "-m",
                "hpctrain",
                "doctor",
                "--profile",
                str(profile),
                "--bisect",
                "shrink",
                "--gpus",
                "1",
            ],
            cwd=live.root,
            env=live.env,
            capture_output=True,
            text=True,
            timeout=240,
        )
    assert bis.returncode == 1 and "\nexclude: n2\n" in bis.stdout + "\n", bis.stdout + bis.stderr
    assert "bad node n2: the preflight checks could not run" in bis.stdout
    for name, info in infos.items():
        run = live.root / "runs" / name
        assert info["state"] == "COMPLETED", (name, info)
        assert (run / "final_params.sha256").read_text() == want, name
        verdicts = [e for e in _lines(run / "events.jsonl") if e["event"] == "preflight"]
        assert verdicts[0]["verdict"] == name and list(verdicts[0]["bad"]) == ["n2"], verdicts
        assert "No module named 'hpctrain'" in verdicts[0]["bad"]["n2"]
        assert "No module named 'hpctrain'" in info["bad_nodes"]["n2"]  # status names it
        assert "bad node n2: the preflight checks could not run" in live.hp("status", name).stdout
        assert "ddp: 1 rank (" in (run / "train.log").read_text()
    requeued = live.root / "runs" / "requeue"
    events = _lines(requeued / "events.jsonl")
    assert [e["event"] for e in events] == ["preflight", "requeue", "done"], events
    assert events[1]["reason"] == "preflight" and events[1]["exclude"] == "n2"
    second = json.loads(
        (requeued / "preflight.json").read_text()
    )  # the gate on the restart: n1 only
    assert second["restart_count"] == 1 and second["action"] == "ok" and second["good"] == ["n1"]
    assert [r["restart_count"] for r in _lines(requeued / "restarts.jsonl")] == [0, 1]
    assert [e["event"] for e in _lines(live.root / "runs" / "shrink" / "events.jsonl")] == [
        "preflight",
        "done",
    ]


STALL_MODULE = '''"""train_entry, but rank 1 stops after step {step} of the first start."""
import os
import time

from train_entry import watchdog
from train_entry.cli import main
from train_entry.dist import exit_now

beat = watchdog.Watchdog.beat


def hang(self, step):
    beat(self, step)
    if self.rank == 1 and step == {step} and os.environ.get(watchdog.ENV_RESTART_COUNT) == "0":
        while True:           # the hang: this rank never takes another step
            time.sleep(1)


watchdog.Watchdog.beat = hang
exit_now(main())
'''


@pytest.mark.slurm
@pytest.mark.timeout(420)
def test_a_stalled_rank_dumps_stacks_requeues_and_resumes(live):
    stall_step, every = 7, 3
    args = [*TRAIN, "--max-steps=12", f"--checkpoint-every={every}"]
    (live.root / "mods").mkdir()
    (live.root / "mods" / "stall_entry.py").write_text(STALL_MODULE.format(step=stall_step))
    live.hp(
        "submit",
        "--profile",
        "loopback",
        "--nodes",
        "2",
        "--gpus",
        "1",
        "--name",
        "stall",
        "--module",
        "stall_entry",
        "--set",
        "watchdog.stall_s=15",
        "--set",
        f"environment.env.PYTHONPATH={live.root / 'mods'}",
        "--",
        *args,
    )
    want = reference(live.root, 2, args)
    info = live.wait("stall", 360)
    run = live.root / "runs" / "stall"
    assert info["state"] == "COMPLETED", info
    assert (run / "final_params.sha256").read_text() == want
    events = [e for e in _lines(run / "events.jsonl") if e["event"] != "preflight"]
    names = [e["event"] for e in events]
    assert names[:2] == ["stall", "requeue"] and names[-1] == "done", events
    stall, requeue = events[0], events[1]
    assert stall["last_step"] == stall_step and requeue["reason"] == "stall"
    stacks = Path(stall["stacks"])
    assert (stacks / "STALLED").is_file()
    assert "in hang" in (stacks / "rank-1.txt").read_text()  # the stalled rank, caught in the act
    assert (
        "all_reduce" in (stacks / "rank-0.txt").read_text()
        or "backward" in (stacks / "rank-0.txt").read_text()
    )  # its peer, waiting for it
    # resumed from the newest checkpoint: no step lost beyond the checkpoint interval
    starts = [int(s) for s in re.findall(r"step (\d+)/12\n", (run / "train.log").read_text())]
    assert starts[0] == 0 and stall_step - every <= starts[1] <= stall_step, starts


def test_bisect_halves_to_the_node_that_breaks_a_set():
    from hpctrain.preflight.bisect import Probe, bisect

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


def test_min_nodes_renders_a_range_and_deepspeed_cannot_shrink(tmp_path):
    from hpctrain.errors import ValidationError
    from hpctrain.kernel import jobenv
    from hpctrain.profiles import resolve
    from hpctrain.render import render
    from hpctrain.request import JobRequest

    profile = resolve("loopback", {})
    req = JobRequest.build(profile, name="r", nodes=2, gpus=1, min_nodes=1, exclude=["n7,n9"])
    text = render(profile, req, str(tmp_path / "r"))
    assert "#SBATCH --nodes=1-2\n" in text and "--ntasks-per-node=1\n#" not in text
    assert "#SBATCH --exclude=n7,n9\n" in text
    assert f"{jobenv.NNODES}=$SLURM_NNODES" in text and "  hpctrain_preflight\n" in text
    with pytest.raises(ValidationError, match="DeepSpeed checkpoints load only at the world size"):
        JobRequest.build(profile, name="r", nodes=2, gpus=1, min_nodes=1, strategy="deepspeed")
    with pytest.raises(ValidationError, match="--min-nodes 3: between 1 and --nodes"):
        JobRequest.build(profile, name="r", nodes=2, gpus=1, min_nodes=3)
