"""Bad nodes, live on the loopback cluster: a real fault made inside one node's own mount namespace,
the preflight gate naming it, the job routing around it (exclude + requeue, and shrink), and a rank
that stops stepping (stacks dumped, requeued, resumed). The gate's decisions on report files:
tests/test_bad_nodes.py.

    sudo .venv/bin/python -m pytest -m slurm tests/test_bad_nodes_live.py

The fault: the job runs a per-test Python environment (a venv whose site-packages holds one .pth
that adds the project's real site-packages); on n2 only, an empty folder is bind-mounted over that
per-test site-packages with `nsenter -t <n2's slurmd> -m`, so on n2 `python -m hpctrain...` fails
with ModuleNotFoundError while n1 is fine. Nothing another test or engineer uses is hidden, and the
mount is always undone."""

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
from _bad_nodes_common import ENDED, STATE, TRAIN
from _events import flow, kinds

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
        """`status` until the run ended; skipped while a job of the run is in Slurm's queue (a
        Python start of ~0.5 s CPU each; asked at least every 15 s: tests/_squeue.py)."""
        from _squeue import queued

        deadline = time.monotonic() + timeout
        while True:
            info, asked = json.loads(self.hp("status", name, "--json").stdout), time.monotonic()
            if info["state"] in ENDED:
                return info
            ids = [str(j["job_id"]) for j in _lines(self.root / "runs" / name / "jobs.jsonl")]
            while True:
                assert time.monotonic() < deadline, (
                    f"{name}: still {info['state']} after {timeout} s"
                )
                time.sleep(2)
                if time.monotonic() - asked >= 15 or not (ids and queued(ids)):
                    break

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
        # n3 (the hot spare of test_spares_live) excluded: with it, the requeue would get n1,n3
        "name: badnodes\nextends: loopback\nslurm:\n  extra_sbatch: ['--nodelist=n1,n2', '--exclude=n3']\n"
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
    events = flow(_lines(requeued / "events.jsonl"))
    assert [e["event"] for e in events] == ["preflight", "requeue", "done"], events
    assert (
        events[1]["reason"] == "preflight" and events[1]["exclude"] == "n2,n3"
    )  # with the profile's
    second = json.loads(
        (requeued / "preflight.json").read_text()
    )  # the gate on the restart: n1 only
    assert second["restart_count"] == 1 and second["action"] == "ok" and second["good"] == ["n1"]
    assert [r["restart_count"] for r in _lines(requeued / "restarts.jsonl")] == [0, 1]
    assert kinds(_lines(live.root / "runs" / "shrink" / "events.jsonl")) == [
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
        "--set",  # the requeue path (in-job restarts: tests/test_in_job_restart.py)
        "preemption.max_in_job_restarts=0",
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
