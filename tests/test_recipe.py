"""examples/README.md's recipe for a user's own DDP script (issue 34), and what makes its preemption
quick and quiet: a torchrun agent leaves instead of starting a rendezvous round after a stop
(launchers/rdzv.py `Guarded`, kernel/fatal.launcher_leaves), `hpctrain logs` leaves a routine
preempt's launcher noise out (service/logs.py `Quiet`), `resume` of a finished run names its step.

Live (local profile, 2 nodes x 2 workers, the recipe as a user copies it): a preemption is running
again within 10 s of its save, bit-identical to an uninterrupted run, with no traceback in `hpctrain
logs`; a SIGKILL of one rank of 4 redoes at most one checkpoint interval and ends bit-identical.
The same preemption on the live Slurm cluster: tests/test_recipe_slurm.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _events import kinds
from _hold import frozen, held, ranks
from _recipe import (
    BACK_S,
    EVERY,
    GPUS,
    NODES,
    NOISE,
    RECIPE,
    REPO,
    STEPS,
    TRAIN,
    back_after_save,
    final_hash,
    lines,
    reference,
    state,
    steps,
    wait_step,
)
from test_parallel_layouts import Home

from hpctrain.kernel import fatal, jobenv, layout, snapshot
from hpctrain.runs.folder import RunDir
from hpctrain.service import resume
from hpctrain.service.logs import Quiet, shown

# ---------------------------------------------------------------- the recipe, as documented


def test_the_readme_recipe_is_the_script_the_tests_run():
    readme = (REPO / "examples" / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert RECIPE.read_text() in blocks, "examples/README.md's recipe and recipe_ddp.py differ"
    table = readme[readme.index("## The runtime API") : readme.index("The recipe")]
    for call in ("fix_ddp_buckets", "snapshot_every", "ckpt.snapshot", "ckpt.save", "should_stop"):
        assert call in table, call
    script = RECIPE.read_text()
    assert "step % args.save_every == 0" in script  # a killed node loses one interval at most
    assert "runtime.fix_ddp_buckets(DDP(" in script  # exact beyond 2 ranks


# ---------------------------------------------------------------- the launcher after a stop


def _job(monkeypatch, run: Path) -> Path:
    stop = run / "STOP"
    for key, value in ((jobenv.JOB_ID, "7"), (jobenv.RUN_DIR, str(run))):
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(jobenv.STOP_FILE, str(stop))
    return stop


def test_a_launcher_leaves_after_a_stop_instead_of_a_new_round(tmp_path, monkeypatch):
    assert fatal.launcher_leaves(tmp_path) is None  # outside a job
    stop = _job(monkeypatch, tmp_path)
    assert fatal.launcher_leaves(tmp_path) is None  # a worker died: the in-job restart goes on
    stop.touch()
    assert fatal.launcher_leaves(tmp_path)[0] == 75  # stopped, nothing saved yet
    (tmp_path / layout.PREEMPTED).touch()
    assert fatal.launcher_leaves(tmp_path)[0] == 0  # saved: the PREEMPTED file requeues
    fatal.write(tmp_path, "rank 1 on n1: ValueError: boom")
    assert fatal.launcher_leaves(tmp_path)[0] == 1


GUARDED = """
import sys
import torch.distributed.elastic.rendezvous  # first, as torchrun: it loads our entry point
from hpctrain.launchers.rdzv import Guarded

class Inner:  # torchrun's handler: a second round would wait on the store (60 s once a peer left)
    def next_rendezvous(self):
        print("round", flush=True)
        return "info"
    def num_nodes_waiting(self):
        print("store asked", flush=True)
        return 1

g = Guarded(Inner())
print(g.next_rendezvous(), g.num_nodes_waiting(), flush=True)
for path in sys.argv[1:]:  # a stop, a rank saved and left 75 (kernel/fatal.left_preempted)
    open(path, "w").close()
print(g.num_nodes_waiting(), flush=True)
g.next_rendezvous()
print("a second round started", flush=True)
"""


def test_torchrun_starts_no_round_after_the_stops_checkpoint(tmp_path, monkeypatch):
    stop = _job(monkeypatch, tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", GUARDED, str(stop), str(tmp_path / layout.PREEMPTED)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split("\n") == ["round", "store asked", "info 1", "0", ""], out.stdout
    assert "the stop's checkpoint is committed" in out.stderr and "Traceback" not in out.stderr


# ---------------------------------------------------------------- `hpctrain logs`, quietly

# node 0's log of the issue's preempt (torch 2.13: 68 s, a c10d wait, the agent's traceback)
OLD_NODE_LOG = textwrap.dedent("""\
    hpctrain: node 0 on vm device=cpu gpu=none CUDA_VISIBLE_DEVICES=unset restart=0 endpoint=127.0.0.1:25770
    [default0]:step 130 loss 0.2898
    E1206 22:56:27.158000 17804 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 75)
    [default0]:hpctrain: not started again: a stop was asked in this job (exit 75)
    [W1206 22:57:32.384167496 socket.cpp:469] [c10d] waitForInput: poll for socket returned 0, likely a timeout
    frame #0: c10d::detail::waitForInput + 0x12 (0x7f in libtorch_cpu.so)
    W1206 22:57:32.909000 17804 torch/distributed/elastic/agent/server/api.py:753] Received 15 death signal
    Traceback (most recent call last):
      File "torch/distributed/elastic/agent/server/api.py", line 528, in _rendezvous
        rdzv_info = spec.rdzv_handler.next_rendezvous()
    torch.distributed.DistStoreError: wait timeout after 60000ms

    During handling of the above exception, another exception occurred:

    Traceback (most recent call last):
      File "torch/distributed/run.py", line 1028, in main
    torch.distributed.elastic.multiprocessing.api.SignalException: Process 17804 got signal: 15
    hpctrain: node 0 on vm device=cpu gpu=none CUDA_VISIBLE_DEVICES=unset restart=1 endpoint=127.0.0.1:25770
    [default0]:[hpctrain runtime] resuming from runs/byo3/checkpoints/step-00000132 (step 132)
    Traceback (most recent call last):
      File "train.py", line 3, in <module>
    ValueError: a real failure, later
    """)


def test_logs_leave_a_routine_preempts_launcher_noise_out(tmp_path):
    log = tmp_path / "node-0.log"
    log.write_text(OLD_NODE_LOG)
    text = shown(log)
    before, after = text.split("restart=1", 1)
    assert not NOISE.search(before), before
    assert "15 line(s) of the launcher's exit after a routine preempt not shown" in before, before
    assert str(log) in before and "[default0]:step 130 loss 0.2898" in before
    assert "resuming from" in after and "ValueError: a real failure, later" in after  # kept
    assert log.read_text() == OLD_NODE_LOG  # the file keeps everything
    quiet = Quiet(log)  # --follow: the same, fed in pieces that split lines
    pieces = [OLD_NODE_LOG[i : i + 37] for i in range(0, len(OLD_NODE_LOG), 37)]
    assert "".join(quiet.feed(p) for p in pieces) + quiet.end() == text


def test_a_failure_without_a_stop_is_shown_whole(tmp_path):
    log = tmp_path / "node-0.log"
    failed = OLD_NODE_LOG.replace("exitcode: 75", "exitcode: 1").replace(
        "[default0]:hpctrain: not started again: a stop was asked in this job (exit 75)\n", ""
    )
    log.write_text(failed)
    assert shown(log) == failed


# ---------------------------------------------------------------- resume of a finished run


def test_resume_of_a_finished_run_names_its_last_step_not_its_newest_checkpoint(tmp_path):
    run = tmp_path / "done"
    run.mkdir()
    rows = [{"step": s, "loss": 0.5, "max_steps": 300, "time": 1.0 + s} for s in (299, 300)]
    (run / layout.METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = RunDir(run)
    old = resume.Checkpoint(name="step-00000132", step=132, strategy="script")
    assert resume._where(r, old) == "step 300/300; newest checkpoint step 132"
    last = resume.Checkpoint(name="step-00000300", step=300, strategy="script")
    assert resume._where(r, last) == "step 300/300"
    with pytest.raises(resume.UserError, match=r"COMPLETED \(step 300/300; newest checkpoint"):
        resume._check_steps(r, "COMPLETED", old, old=None, new=None)


# ---------------------------------------------------------------- live, local profile


@pytest.fixture(scope="module")
def ref(tmp_path_factory) -> str:
    return reference(tmp_path_factory)


def _submit(home: Home, name: str) -> Path:
    home.hp(
        "submit", "--profile", "local", "--nodes", str(NODES), "--gpus", str(GPUS),
        "--name", name, "--script", str(RECIPE), "--", *TRAIN,
    )  # fmt: skip
    return home.root / "runs" / name


def _ended(run: Path, timeout: float = 240) -> str:
    import time

    deadline = time.monotonic() + timeout
    while state(run) in ("PENDING", "RUNNING"):
        assert time.monotonic() < deadline, f"{run.name} still {state(run)}"
        time.sleep(0.2)
    return state(run)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_recipe_preempted_is_back_within_10_s_bit_identical_and_quiet(ref, tmp_path):
    home = Home(tmp_path)
    run = _submit(home, "pre")
    wait_step(run, 5)
    with held(run):  # the stop lands mid-run however loaded the machine is
        home.hp("preempt", "pre")
    assert _ended(run) == "COMPLETED"
    assert kinds(lines(run / layout.EVENTS)) == ["signal", "preempted", "requeue", "done"]
    requeued, started = back_after_save(run)
    assert started <= BACK_S, (requeued, started)  # the local profile starts it again at once
    assert final_hash(run) == ref
    stopped = lines(run / layout.EVENTS)[1]["step"]
    assert steps(run) == list(range(1, STEPS + 1)), (stopped, steps(run))  # none redone
    shown_logs = home.hp("logs", "pre").stdout
    assert not NOISE.search(shown_logs), shown_logs[-3000:]
    assert "the stop's checkpoint is committed" in shown_logs
    assert not snapshot.run_folder(run).exists()  # runtime.exit freed the snapshots in memory


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_recipe_survives_a_killed_rank_of_4_redoing_one_interval_at_most(ref, tmp_path):
    home = Home(tmp_path)
    run = _submit(home, "kill")
    wait_step(run, 2 * EVERY + 5)
    pids = ranks(run)
    assert len(pids) == NODES * GPUS, pids
    with frozen(pids):  # every rank still, so the kill never races the end
        reached = steps(run)[-1]
        assert reached < STEPS
        os.kill(pids[-1], signal.SIGKILL)
    assert _ended(run) == "COMPLETED"
    (restart,) = [e for e in lines(run / layout.EVENTS) if e["event"] == "in_job_restart"]
    assert restart["resumed_step"] >= reached // EVERY * EVERY, (reached, restart)
    assert restart["steps_redone"] <= EVERY, restart
    assert not [e for e in lines(run / layout.EVENTS) if e["event"] == "requeue"]
    assert final_hash(run) == ref
    assert not snapshot.run_folder(run).exists()


def test_resume_keeps_the_runs_node_range_and_excluded_nodes() -> None:
    """`hpctrain resume` built a new request field by field and dropped --min-nodes/--exclude."""
    from hpctrain.jobs.request import JobRequest

    req = JobRequest(name="r", nodes=4, gpus=2, time_min=60, min_nodes=2, exclude=("n7",))
    same = resume.resumed(req, nodes=4, time_min=90, args=("--max-steps", "9"))
    assert (same.min_nodes, same.exclude, same.time_min, same.args) == (
        2, ("n7",), 90, ("--max-steps", "9"),
    )  # fmt: skip
    fewer = resume.resumed(req, nodes=2, time_min=60, args=())
    assert (fewer.nodes, fewer.min_nodes, fewer.exclude) == (2, None, ("n7",))
