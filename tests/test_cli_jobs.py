"""The job CLI through the real `hpctrain` command: render == what submit hands over (local and, with a
stand-in sbatch at the subprocess boundary, Slurm through submitit), dry runs write nothing, user
errors exit 2 without a traceback, and real local runs (tiny gloo scripts, 2 simulated nodes x 1
worker under torchrun) with status, logs, cancel and --wait. The CLI never imports torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.kernel import jobenv

REPO = Path(__file__).resolve().parent.parent
HPCTRAIN = [sys.executable, "-m", "hpctrain"]

GLOO = f"""
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {{dist.get_rank()}}/{{dist.get_world_size()}} node {{os.environ[{jobenv.NODEID!r}]}} "
      f"sum {{t.item()}} args {{sys.argv[1:]!r}}", flush=True)
"""
FAIL = "import sys; sys.exit(3)\n"
SLEEP = "import time\nfor _ in range(600): time.sleep(0.2)\n"  # no STOP polling: cancel must still stop it


@pytest.fixture
def cli(tmp_path):
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "OMP_NUM_THREADS": "1",
    }
    env.pop(jobenv.SITE_PATH, None)
    env.pop(jobenv.PYTHON, None)
    for name, text in (("gloo_job.py", GLOO), ("fail.py", FAIL), ("sleep.py", SLEEP)):
        (tmp_path / name).write_text(text)

    def run(*args: str, extra_env: dict[str, str] | None = None, timeout: float = 120):
        return subprocess.run(
            [*HPCTRAIN, *args],
            cwd=tmp_path,
            env={**env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    run.tmp = tmp_path
    run.env = env
    return run


def ok(out):
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def user_error(out, *needles):
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    for n in needles:
        assert n in out.stderr, out.stderr
    return out


def test_local_run_end_to_end_render_equals_submit(cli):
    opts = [
        "--profile",
        "local",
        "--nodes",
        "2",
        "--gpus",
        "1",
        "--name",
        "g",
        "--script",
        "gloo_job.py",
    ]
    args = ["--", "--x", "a b", "$(id)"]
    rendered = ok(cli("render", *opts, *args)).stdout
    out = ok(cli("submit", *opts, "--wait", *args, timeout=180))
    assert "g: COMPLETED" in out.stdout
    run = cli.tmp / "runs" / "g"
    assert (run / "job.sh").read_text() == rendered  # byte for byte what the local executor ran
    # run.yaml freezes everything needed to render the same script again (what a resume relies on)
    from hpctrain.jobs.request import JobRequest
    from hpctrain.jobs.spec import JobSpec
    from hpctrain.profiles import Profile
    from hpctrain.render.script import render
    from hpctrain.runs.folder import RunDir

    frozen = RunDir(run).frozen()
    again = render(
        JobSpec.build(
            Profile.model_validate(frozen["profile"]),
            JobRequest.from_dict(frozen["request"]),
            run,
            python=frozen["node_python"],
        )
    )
    assert again == rendered
    for node in (0, 1):
        log = (run / "logs" / f"node-{node}.log").read_text()
        assert f"rank {node}/2 node {node} sum 3.0 args ['--x', 'a b', '$(id)']" in log
    status = json.loads(ok(cli("status", "g", "--json")).stdout)
    assert status["state"] == "COMPLETED" and status["nodes"] == 2 and status["restarts"] == 0
    assert status["job_id"] == json.loads((run / "jobs.jsonl").read_text())["job_id"]
    assert status["checkpoint_step"] is None and len(status["history"]) == 1
    assert "rank 1/2" in ok(cli("logs", "g", "--node", "1")).stdout
    assert "==> " in ok(cli("logs", "g")).stdout
    assert (
        "rank 0/2" in ok(cli("logs", "g", "--node", "0", "--follow", timeout=30)).stdout
    )  # ends with the job
    assert "rank 1/2 node 1" in ok(cli("logs", "g", "--rank", "1")).stdout  # torchrun's --tee files
    user_error(cli("logs", "g", "--rank", "7"), "rank-7.log does not exist")
    assert [r["name"] for r in json.loads(ok(cli("runs", "--json")).stdout)] == ["g"]
    assert "COMPLETED" in ok(cli("runs")).stdout
    # The name is taken: a finished run only with --replace-finished (see test_replace_finished_...).
    user_error(cli("submit", *opts, "--dry-run", *args), "--replace-finished")
    ok(cli("submit", *opts, "--dry-run", "--replace-finished", *args))
    # status works from anywhere through the run index
    elsewhere = subprocess.run(
        [*HPCTRAIN, "status", "g", "--json"], cwd="/", env=cli.env, capture_output=True, text=True
    )
    assert json.loads(ok(elsewhere).stdout)["path"] == str(run)


def test_wait_fails_when_the_job_fails(cli):
    out = cli(
        "submit",
        "--profile",
        "local",
        "--nodes",
        "1",
        "--gpus",
        "1",
        "--name",
        "f",
        "--script",
        "fail.py",
        "--wait",
        timeout=180,
    )
    assert out.returncode == 1 and "f: FAILED" in out.stdout, out.stdout + out.stderr
    # why (the worker's exit, not torchrun's wrapper traceback) and where the whole log is
    assert "why: rank 0 on " in out.stderr and "exited with code 3" in out.stderr, out.stderr
    assert "full log: " in out.stderr and "Traceback" not in out.stderr, out.stderr
    state = json.loads((cli.tmp / "runs" / "f" / "state.json").read_text())
    assert state["state"] == "FAILED" and state["exit_code"] != 0
    assert json.loads(ok(cli("status", "f", "--json")).stdout)["state"] == "FAILED"
    # it failed before any step: the name may be used again, the old folder is kept aside
    again = ok(cli("submit", "--profile", "local", "--name", "f", "--script", "fail.py"))
    assert "failed before its first step" in again.stdout, again.stdout
    aside = [p.name for p in (cli.tmp / "runs").iterdir() if p.name.startswith("f.failed-")]
    assert len(aside) == 1 and (cli.tmp / "runs" / aside[0] / "logs" / "node-0.log").is_file()


def test_cancel_stops_a_local_run_and_the_job_survives_the_cli(cli):
    ok(
        cli(
            "submit",
            "--profile",
            "local",
            "--nodes",
            "2",
            "--gpus",
            "1",
            "--name",
            "c",
            "--script",
            "sleep.py",
        )
    )
    run = cli.tmp / "runs" / "c"
    deadline = time.monotonic() + 60
    while not (run / "logs" / "node-1.log").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert (
        json.loads(ok(cli("status", "c", "--json")).stdout)["state"] == "RUNNING"
    )  # the CLI has exited
    pid = json.loads((run / "state.json").read_text())["pid"]
    out = ok(cli("cancel", "c", timeout=120))
    assert "now CANCELLED" in out.stdout
    assert (
        not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    )
    events = [json.loads(x)["event"] for x in (run / "events.jsonl").read_text().splitlines()]
    assert events[0] == "signal"
    assert "nothing to cancel" in ok(cli("cancel", "c")).stdout


def test_slurm_submit_hands_over_the_rendered_script(cli):
    """submitit's SlurmExecutor with a stand-in sbatch/sacct/scontrol/scancel on PATH."""
    bin_ = cli.tmp / "bin"
    bin_.mkdir()
    scripts = {
        "sbatch": 'cp "$1" "$RECORD/submitted.sh"; echo "Submitted batch job 77"',
        "sacct": 'if [ -e "$RECORD/no-sacct" ]; then echo "accounting disabled" >&2; exit 1; fi\n'
        'printf "JobID|State|NodeList\\n77|RUNNING|n[1-2]\\n77.batch|RUNNING|n1\\n"',
        # the controller's state: RUNNING, or what the test wrote to $RECORD/ctl
        "scontrol": 'echo "JobId=77 JobName=s JobState=$(cat "$RECORD/ctl" 2>/dev/null || echo RUNNING)"',
        "scancel": 'echo "$@" >"$RECORD/scancel"',
    }
    for name, body in scripts.items():
        (bin_ / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    env = {
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "RECORD": str(cli.tmp),
        jobenv.PYTHON: "/opt/py/bin/python",
    }
    opts = [
        "--profile",
        "loopback",
        "--nodes",
        "2",
        "--gpus",
        "2",
        "--name",
        "s",
        "--time",
        "5",
        "--",
        "--max-steps",
        "5",
    ]
    rendered = ok(cli("render", *opts, extra_env=env)).stdout
    out = ok(cli("submit", *opts, extra_env=env))
    assert "job 77" in out.stdout
    run = cli.tmp / "runs" / "s"
    assert (cli.tmp / "submitted.sh").read_text() == rendered == (run / "job.sh").read_text()
    assert "#SBATCH --nodes=2" in rendered and "#SBATCH --gpus-per-node=2" in rendered
    assert json.loads((run / "jobs.jsonl").read_text())["job_id"] == "77"
    assert json.loads(ok(cli("status", "s", "--json", extra_env=env)).stdout)["state"] == "RUNNING"
    (cli.tmp / "no-sacct").touch()  # accounting off: the controller's state alone
    (cli.tmp / "ctl").write_text("PENDING\n")
    assert json.loads(ok(cli("status", "s", "--json", extra_env=env)).stdout)["state"] == "PENDING"
    ok(cli("cancel", "s", extra_env=env))
    assert (cli.tmp / "scancel").read_text().strip() == "77"
    user_error(cli("submit", *opts, extra_env=env), "hpctrain resume s")
    # --strategy auto: the plan picks the strategy and ZeRO stage, saved as plan.json in the run folder
    ok(
        cli(
            "submit",
            "--profile",
            "generic-ib",
            "--set",
            f"storage.runs_dir={cli.tmp}/runs",
            "--nodes",
            "2",
            "--strategy",
            "auto",
            "--params",
            "7000000000",
            "--name",
            "auto",
            extra_env=env,
        )
    )
    plan = json.loads((cli.tmp / "runs" / "auto" / "plan.json").read_text())
    # FSDP (core) where ZeRO-2 (DeepSpeed, optional) also fits; the plan's settings ride along
    assert (plan["strategy"], plan["zero_stage"]) == ("fsdp", None)
    assert (
        "--strategy fsdp --train.precision=bf16 --train.micro_batch=1 --train.global_batch=16)"
        in (cli.tmp / "runs" / "auto" / "job.sh").read_text()
    )


def test_dry_run_writes_nothing(cli):
    out = ok(cli("submit", "--profile", "loopback", "--nodes", "2", "--name", "d", "--dry-run"))
    assert "would submit d to Slurm" in out.stdout and "nothing was written" in out.stdout
    assert not (cli.tmp / "runs").exists() and not (cli.tmp / "state").exists()


@pytest.fixture
def invoke(tmp_path, monkeypatch):
    """In-process CliRunner (fast): isolated config/state, cwd in tmp_path."""
    from click.testing import CliRunner

    from hpctrain.cli import main

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    return lambda *args: runner.invoke(main, list(args))


USER_ERRORS = [
    (["--name", "a'; touch /tmp/x"], ["not a valid run name"]),
    (["--name", "$(id)"], ["not a valid run name"]),
    (["--name", "a\nb"], ["not a valid run name"]),
    (
        ["--gpus", "3", "--nodes", "4", "--time", "99"],
        ["3 problems", "use --gpus 2", "use --nodes 3", "use --time 30"],
    ),
    (["--script", "missing.py"], ["missing.py is not a file"]),
    (["--module", "not a module"], ["is not a Python module name"]),
    (["--strategy", "auto"], ["--params N"]),
    (["--set", "slurm.partitoin=x"], ["partitoin"]),
    (["--set", "nokey"], ["KEY=VALUE"]),
    (["--node", "2"], ["No such option", "--nodes"]),  # a typo is not silently handed to the entry
]


def test_user_errors_exit_2(invoke):
    for args, needles in USER_ERRORS:
        for cmd in (["submit", "--dry-run"], ["render"]):
            res = invoke(*cmd, "--profile", "loopback", *args)
            assert res.exit_code == 2 and isinstance(res.exception, SystemExit), (
                args,
                res.output,
                res.exception,
            )
            for n in needles:
                assert n in res.output, (args, res.output)
    res = invoke("render", "--profile", "generic-ib", "--partition", "x")  # flags are the top layer
    assert res.exit_code == 2 and "slurm.partition is locked" in res.output, res.output
    for cmd in (["status", "nope"], ["logs", "nope"], ["cancel", "nope"]):
        res = invoke(*cmd)
        assert res.exit_code == 2 and "no run 'nope'" in res.output, res.output


def test_help_has_examples(invoke):
    for cmd in ("render", "submit", "status", "logs", "cancel", "runs"):
        res = invoke(cmd, "--help")
        assert res.exit_code == 0 and "Example" in res.output


def test_replace_finished_moves_the_old_run_aside(tmp_path, monkeypatch):
    from hpctrain.jobs.request import JobRequest
    from hpctrain.kernel.errors import UserError
    from hpctrain.profiles import resolve
    from hpctrain.runs.folder import RunDir

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    profile = resolve("local", {})
    req = JobRequest.build(profile, name="r")
    run = RunDir(tmp_path / "runs" / "r")
    run.create(profile=profile, request=req, script="echo first\n")
    (run.path / "checkpoints").mkdir()
    run.check_free("FAILED")  # failed before its first step: the name may be used again
    (run.path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.8}\n')  # now it trained
    with pytest.raises(UserError, match="hpctrain resume r"):
        run.check_free("FAILED", replace_finished=True)  # only a COMPLETED run may be replaced
    with pytest.raises(UserError, match="--replace-finished"):
        run.check_free("COMPLETED")
    run.check_free("COMPLETED", replace_finished=True)
    run.create(profile=profile, request=req, script="echo second\n", replace_finished=True)
    old = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith("r.old-")]
    assert (
        len(old) == 1
        and (old[0] / "checkpoints").is_dir()
        and (old[0] / "job.sh").read_text() == "echo first\n"
    )
    assert run.job_sh.read_text() == "echo second\n" and run.frozen()["request"]["name"] == "r"
    (tmp_path / "stray").mkdir()
    with pytest.raises(UserError, match="not a run folder"):
        RunDir(tmp_path / "stray").check_free(None, replace_finished=True)


def test_plan_args():
    from types import SimpleNamespace as P

    from hpctrain.cli.jobs import plan_args

    assert plan_args(P(strategy="ddp", zero_stage=None, offload="none")) == []
    assert plan_args(P(strategy="fsdp", zero_stage=None, offload="optimizer+params")) == [
        "--fsdp.cpu_offload=true"
    ]
    assert plan_args(P(strategy="deepspeed", zero_stage=3, offload="optimizer+params")) == [
        "--deepspeed.zero_stage=3",
        "--deepspeed.offload_optimizer=cpu",
        "--deepspeed.offload_param=cpu",
    ]
    assert plan_args(P(strategy="deepspeed", zero_stage=1, offload="none")) == [
        "--deepspeed.zero_stage=1"
    ]
    mesh = P(strategy="fsdp", zero_stage=None, offload="none", tp=8, pp=16, schedule="1f1b")
    assert plan_args(mesh) == ["--parallel.tp=8", "--parallel.pp=16", "--parallel.schedule=1f1b"]


def test_cli_never_imports_torch(cli):
    code = """
import sys
from click.testing import CliRunner
from hpctrain.cli import main
r = CliRunner()
for args in (["render", "--profile", "loopback", "--name", "t"],
             ["submit", "--profile", "local", "--name", "t", "--dry-run"],
             ["status"], ["runs", "--json"], ["status", "nope"], ["logs", "nope"], ["cancel", "nope"]):
    res = r.invoke(main, args)
    assert res.exit_code in (0, 2), (args, res.output)
bad = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "deepspeed", "numpy"))
print(bad)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=cli.tmp, env=cli.env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
