"""Keys that real clusters need (issue 34, "Real clusters"): `network.ib: unset` in a file, the GPU
type (`slurm.gpu_type`, `--gpu-type`), a login shell for the modules (`environment.login_shell`),
the per-task GPU requests refused alike, and a SIGTERM-with-grace preemption
(`preemption.signal: TERM`), its batch-shell logic run with stand-in srun/scontrol/python. The live
preemption on the test cluster is tests/test_term_preempt_live.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _profiles_common import cli, invalid, write
from test_render import make_standins, shellcheck
from test_sites import script

from hpctrain.kernel import exitcodes, jobenv
from hpctrain.profiles import resolve

SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n1"}


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)


def site(tmp_path: Path, body: str, name: str = "site") -> Path:
    return write(tmp_path / "profiles" / f"{name}.yaml", f"name: {name}\nextends: loopback\n{body}")


def sbatch_lines(text: str) -> list[str]:
    return [ln.split()[1] for ln in text.splitlines() if ln.startswith("#SBATCH ")]


def test_ib_unset_in_a_file_means_what_it_means_with_set(tmp_path):
    path = site(tmp_path, "network:\n  ib: unset\n")
    assert cli("profiles", "validate", str(path)).exit_code == 0
    from_file = script(str(path), {}, tmp_path / "runs" / "a", tmp_path)
    from_flag = script("loopback", {"network.ib": "unset"}, tmp_path / "runs" / "a", tmp_path)
    assert resolve(str(path)).network.ib == "unset"
    assert "NCCL_IB_DISABLE" not in from_file and "NCCL_IB_DISABLE" not in from_flag
    # one meaning: the scripts differ only in the profile's name
    named = from_file.replace("=site", "=loopback").replace("(profile site)", "(profile loopback)")
    assert named == from_flag
    # a quoted boolean is still a quoting mistake; another word is still refused
    assert "quoted text" in invalid(site(tmp_path, "network:\n  ib: 'true'\n", "q"))
    assert "not true, false or unset" in invalid(site(tmp_path, "network:\n  ib: maybe\n", "m"))


@pytest.mark.parametrize(
    ("request_kind", "expected"),
    [("gpus-per-node", "--gpus-per-node=A100:2"), ("gres", "--gres=gpu:A100:2")],
)
def test_gpu_type_names_the_gpus_of_the_request(tmp_path, request_kind, expected):
    flags = {"slurm.gpu_request": request_kind, "slurm.gpu_type": "A100"}
    text = script("loopback", flags, tmp_path / "runs" / "g", tmp_path, gpus=2)
    gpu = [d for d in sbatch_lines(text) if d.startswith(("--gpus", "--gres"))]
    assert gpu == [expected], gpu
    plain = script("loopback", {"slurm.gpu_request": request_kind}, tmp_path / "r" / "g", tmp_path)
    assert "A100" not in plain


def test_gpu_type_from_a_file_the_command_line_and_profiles_show(tmp_path):
    path = site(tmp_path, "slurm:\n  gpu_type: gh200\n  gpu_request: gres\n")
    shown = cli("profiles", "show", str(path))
    assert shown.exit_code == 0 and "gpu_type" in shown.output and "gh200" in shown.output
    out = cli("render", "--profile", str(path), "--nodes", "1", "--gpus", "2", "--gpu-type", "H100")
    assert out.exit_code == 0, out.output
    assert "#SBATCH --gres=gpu:H100:2" in out.output and "gh200" not in out.output


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("slurm:\n  gpu_type: 'A100 x'\n", "is not a Slurm GPU type"),
        ("slurm:\n  gpu_type: a100:4\n", "is not a Slurm GPU type"),
        ("slurm:\n  gpu_type: A100\n  gpu_request: none\n", "gpu_request is none"),
        ("slurm:\n  gpu_type: A100\n  gpus_per_node: 0\n", "gpus_per_node is 0"),
    ],
)
def test_a_bad_gpu_type_is_one_line_naming_the_key(tmp_path, body, says):
    out = invalid(site(tmp_path, body))
    assert says in out and "slurm.gpu_type" in out and "fix:" in out, out


@pytest.mark.parametrize("key", ["extra_sbatch", "srun_args"])
def test_per_task_gpu_requests_are_refused_alike(tmp_path, key):
    said = []
    for option in ("--gpus-per-task=1", "--tres-per-task=gres/gpu:1", "--gpus-per-socket=1"):
        out = invalid(site(tmp_path, f"slurm:\n  {key}: ['{option}']\n", "t"))
        assert f"slurm.{key}" in out and "hpctrain sets --" in out, out
        said.append(out.split("fix: ", 1)[1].strip())
    assert said[0] == said[1], said  # --gpus-per-task and --tres-per-task: the same fix


def test_login_shell_reads_etc_profile_before_setup_and_modules(tmp_path):
    body = "environment:\n  login_shell: true\n  setup: ['ulimit -c 0']\n  modules: [cuda/12]\n"
    text = script(str(site(tmp_path, body)), {}, tmp_path / "runs" / "l", tmp_path)
    lines = text.splitlines()
    at = lines.index("source /etc/profile")
    assert lines[at - 2].startswith("set +u") and lines[at + 1] == "set -u", lines[at - 3 : at + 2]
    assert at < lines.index("ulimit -c 0") < lines.index("hpctrain_module load cuda/12")
    (tmp_path / "login.sh").write_text(text)
    shellcheck(tmp_path / "login.sh")
    assert "/etc/profile" not in script("loopback", {}, tmp_path / "runs" / "n", tmp_path)


def test_term_is_a_preemption_signal_kill_is_not(tmp_path):
    text = script("loopback", {"preemption.signal": "TERM"}, tmp_path / "runs" / "t", tmp_path)
    assert "--signal=B:TERM@30" in sbatch_lines(text)
    assert text.count("trap 'hpctrain_on_signal TERM' TERM\n") == 1
    assert "hpctrain_on_signal USR2" not in text
    (tmp_path / "term.sh").write_text(text)
    shellcheck(tmp_path / "term.sh")
    out = invalid(site(tmp_path, "preemption:\n  signal: KILL\n"))
    assert "preemption.signal" in out and "TERM where the site preempts" in out


# A rank of a run with preemption.signal TERM: trains until the stop (the STOP file, as the
# batch shell's trap makes it, or its own SIGTERM, as Slurm's preemption sends the tasks), then
# "saves" and leaves 75.
TERM_RANK = f"""#!{sys.executable}
import os, signal, sys, time
if sys.argv[1:2] == ["-c"]:
    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
open(os.path.join(os.environ["RECORD"], "started"), "w").close()
while not stop and not os.path.exists(os.environ[{jobenv.STOP_FILE!r}]):
    time.sleep(0.05)
sys.exit(75)
"""
SCONTROL = """#!/bin/bash
echo "$@" >>"$RECORD/scontrol.calls"
if [ "$1 $2" = "show hostnames" ]; then echo localhost; fi
if [ "$1 $2" = "show job" ]; then echo "JobId=$SLURM_JOB_ID JobState=$JOB_STATE Reason=None"; fi
"""


def term_job(tmp_path: Path, job_state: str, *, cancel: bool = False, to: str = "batch"):
    """The batch script of a TERM-preemption run, given one TERM: to the batch shell, or to the
    tasks only (Slurm's preemption with a GraceTime). Returns (exit code, scontrol calls, events)."""
    bin_, rec = make_standins(tmp_path)
    (bin_ / "python").write_text(TERM_RANK)
    (bin_ / "scontrol").write_text(SCONTROL)
    run_dir = tmp_path / "runs" / "t"
    flags = {"preemption.signal": "TERM", "launch.launcher": "srun"}
    text = script("loopback", flags, run_dir, bin_, nodes=1, gpus=1)
    (rec.parent / "job.sh").write_text(text)
    env = {
        **os.environ,
        **SLURM_ENV,
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "RECORD": str(rec),
        "JOB_STATE": job_state,
        jobenv.PYTHON: str(bin_ / "python"),
    }
    log = (rec / "batch.out").open("w")
    proc = subprocess.Popen(
        ["bash", str(rec.parent / "job.sh")],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (rec / "started").exists():
            alive = time.monotonic() < deadline and proc.poll() is None
            assert alive, (rec / "batch.out").read_text()
            time.sleep(0.05)
        if cancel:  # what `hpctrain cancel` does first (hpctrain.dispatch.mark_cancel)
            (run_dir / "CANCEL").write_text("17\n4242\n")
        if to == "batch":
            os.kill(proc.pid, signal.SIGTERM)
        else:
            subprocess.run(["pkill", "-TERM", "-s", str(proc.pid), "-f", "python"], check=False)
        rc = proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    calls = (rec / "scontrol.calls").read_text().splitlines()
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    return rc, calls, events


@pytest.mark.parametrize("to", ["batch", "tasks"])
def test_a_term_saves_and_the_batch_shell_requeues_the_job(tmp_path, to):
    rc, calls, events = term_job(tmp_path, "RUNNING", to=to)
    assert rc == 0 and f"requeue {SLURM_ENV['SLURM_JOB_ID']}" in calls, (rc, calls)
    names = [e["event"] for e in events]
    assert names == ["signal", "requeue"], names
    assert events[0]["signal"] == "TERM"
    assert events[0].get("to") == ("tasks" if to == "tasks" else None)  # the tasks' TERM only


def test_a_term_of_a_job_slurm_ends_itself_is_not_requeued_again(tmp_path):
    # the end of a GraceTime (Slurm requeues the job itself), the time limit, a plain scancel
    rc, calls, _ = term_job(tmp_path, "PENDING")
    assert rc == 75 and not any(c.startswith("requeue") for c in calls), calls


def test_hpctrain_cancel_still_ends_a_term_run_cancelled(tmp_path):
    rc, calls, events = term_job(tmp_path, "RUNNING", cancel=True)
    assert rc == exitcodes.TERMINATED, rc
    assert not any(c.startswith(("requeue", "show job")) for c in calls), calls
    assert [e["event"] for e in events] == ["signal"], events  # no requeue event


def test_hpctrain_cancel_marks_the_job_before_it_signals(tmp_path, monkeypatch):
    from hpctrain.dispatch import slurm
    from hpctrain.runs.folder import RunDir

    run = RunDir(tmp_path / "runs" / "c")
    run.path.mkdir(parents=True)
    for job_id in ("41", "42"):
        run.add_job(job_id, kind="submit", scheduler="slurm")
    marked_when_signalled = []
    monkeypatch.setattr(
        slurm, "cancel", lambda job_id: marked_when_signalled.append(run.file("CANCEL").read_text())
    )
    monkeypatch.setattr(slurm.Slurm, "state", lambda self, run: "CANCELLED")
    assert slurm.SCHEDULER.cancel(run) == "CANCELLED"
    assert marked_when_signalled == ["42\n"]  # the newest job, marked before scancel ran
    slurm.SCHEDULER.cancel(run)
    assert run.file("CANCEL").read_text() == "42\n42\n"  # appended, never replaced
