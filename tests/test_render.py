"""Rendering: golden scripts for every shipped profile, bash -n and shellcheck, quoting, site overrides,
topology from one source, and the rendered script EXECUTED with stand-in srun/scontrol/python to prove
that hostile values arrive intact and inject nothing, and that the port policy holds.

Refresh the golden files after an intended change: `make golden`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.jobs.request import JobRequest
from hpctrain.jobs.spec import JobSpec
from hpctrain.kernel import jobenv
from hpctrain.kernel.errors import UserError, ValidationError
from hpctrain.profiles import resolve
from hpctrain.render.script import _shvalue, render
from hpctrain.runs.folder import runs_dir_of

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"
PROFILES = sorted(p.stem for p in (REPO / "site_configs").glob("*.yaml"))
GOLDEN_PYTHON = "/opt/hpctrain/bin/python"
GOLDEN_RUNS = "/scratch/runs"
HOSTILE = [
    "a'; touch {m}/quote; '",
    "$(touch {m}/dollar)",
    "`touch {m}/backtick`",
    "x\ntouch {m}/newline",
    "ünïcødé ✓",
    "--flag=$HOME",
    "",
    "a b  c",
    "\\",
    "*",
]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """No user config, no site path, a fixed node python: renders depend only on the repo."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    monkeypatch.setenv(jobenv.PYTHON, GOLDEN_PYTHON)


def golden_script(name: str, **flags: object) -> str:
    """The fixed request behind the golden files (and the wheel test): 2 nodes, profile defaults."""
    profile = resolve(name, {"storage.runs_dir": GOLDEN_RUNS, **flags})
    req = JobRequest.build(profile, name="golden", nodes=2, args=["--max-steps", "10"])
    return render(JobSpec.build(profile, req, runs_dir_of(profile) / req.name))


def shellcheck(path: Path) -> None:
    exe = shutil.which("shellcheck")
    assert exe, "shellcheck is missing: `make sysdeps` (apt-get install -y shellcheck)"
    out = subprocess.run([exe, "--shell=bash", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("name", PROFILES)
def test_golden(name, tmp_path):
    text = golden_script(name)
    path = GOLDEN / f"{name}.sh"
    if os.environ.get(jobenv.UPDATE_GOLDEN):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), (
        f"no golden for {name}: make golden ({jobenv.UPDATE_GOLDEN}=1 pytest {__file__})"
    )
    assert text == path.read_text(), (
        f"{name} renders differently from {path}; if intended, refresh: "
        f"make golden ({jobenv.UPDATE_GOLDEN}=1 pytest {__file__} -k golden)"
    )
    assert golden_script(name) == text  # deterministic
    script = tmp_path / "job.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    shellcheck(script)


def test_every_profile_has_a_golden():
    assert {p.stem for p in GOLDEN.glob("*.sh")} == set(PROFILES)


def test_slurm_header_order_and_topology():
    text = golden_script("generic-ib")
    directives = [ln.split()[1] for ln in text.splitlines() if ln.startswith("#SBATCH")]
    keys = [d.split("=")[0] for d in directives]
    assert keys[:6] == [
        "--job-name",
        "--nodes",
        "--ntasks-per-node",
        "--gres",
        "--cpus-per-task",
        "--mem",
    ]
    assert (
        "--nodes=2" in directives
        and "--ntasks-per-node=1" in directives
        and "--gres=gpu:8" in directives
    )
    assert "--signal=B:USR2@300" in directives and "--requeue" in directives
    assert (
        "--open-mode=append" in directives
        and f"--output={GOLDEN_RUNS}/golden/logs/batch.log" in directives
    )
    assert f"export {jobenv.NNODES}=2" in text and f"export {jobenv.GPUS_PER_NODE}=8" in text
    assert 'export NCCL_IB_HCA="mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"' in text
    assert 'source "$HOME/venvs/train"/bin/activate' in text


def test_gpus_per_node_request_and_container():
    text = golden_script("aws-efa")
    assert "#SBATCH --gpus-per-node=8" in text and "--gres" not in text
    assert '--container-image="nvcr.io#nvidia/pytorch:25.06-py3"' in text  # torch 2.8: in range
    assert (
        f'--container-mounts="/fsx:/fsx,/opt/amazon/efa:/opt/amazon/efa:ro,{GOLDEN_RUNS}/golden:'
        f'{GOLDEN_RUNS}/golden" --container-writable)'
    ) in text
    assert "SC2054" not in text  # the container line is shellcheck clean without a disable
    assert 'source "/fsx/hpctrain/venv"/bin/activate' in text and 'PYTHON="python"' in text


def test_request_problems_all_at_once():
    profile = resolve("loopback", {})
    with pytest.raises(ValidationError) as e:
        JobRequest.build(profile, name="ok", nodes=4, gpus=3, time_min=31)
    msg = str(e.value)
    assert "3 problems" in msg
    assert "--gpus 3 is more than the 2 GPUs per node" in msg and "use --gpus 2" in msg
    assert (
        "--nodes 4 is more than the 3 nodes" in msg
        and "--time 31 is more than the 30 minutes" in msg
    )


@pytest.mark.parametrize(
    "bad", ["a'; touch /tmp/x", "$(id)", "`id`", "a\nb", "ünï", "-x", "", "a" * 65, "a/b"]
)
def test_hostile_names_refused(bad):
    with pytest.raises(ValidationError, match="not a valid run name"):
        JobRequest.build(resolve("local", {}), name=bad)


def test_shvalue_expands_variables_only():
    assert _shvalue("/opt/x/lib:$LD_LIBRARY_PATH") == '"/opt/x/lib:$LD_LIBRARY_PATH"'
    assert _shvalue('$(id) `id` \\ "') == '"\\$(id) \\`id\\` \\\\ \\""'
    out = subprocess.run(
        ["bash", "-c", f"X=abc; printf %s {_shvalue('${X}-$(echo no)-`echo no`')}"],
        capture_output=True,
        text=True,
    ).stdout
    assert out == "abc-$(echo no)-`echo no`"


def test_sbatch_lines_refuse_unsafe_paths():
    profile = resolve("loopback", {})
    req = JobRequest.build(profile, name="p")
    with pytest.raises(UserError, match="cannot put .* on an #SBATCH line"):
        render(JobSpec.build(profile, req, "/tmp/a b\n#SBATCH --x/p"))


def test_site_template_overrides_one_block(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "templates").mkdir(parents=True)
    (site / "templates" / "sbatch.sh.j2").write_text(
        '{% extends "hpctrain/sbatch.sh.j2" %}\n'
        "{% block setup %}{{ super() | safe }}export SITE_MARKER={{ job.name }}\n{% endblock %}\n"
    )
    for p in (site, site / "templates", site / "templates" / "sbatch.sh.j2"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    monkeypatch.setenv(jobenv.SITE_PATH, str(site))
    text = golden_script("loopback")
    assert "export SITE_MARKER=golden\n" in text
    assert text.replace("export SITE_MARKER=golden\n", "") == (GOLDEN / "loopback.sh").read_text()
    (site / "templates" / "sbatch.sh.j2").chmod(0o666)
    with pytest.raises(UserError, match="group-writable.*Refusing template"):
        golden_script("loopback")


def test_site_template_cannot_break_topology(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "templates").mkdir(parents=True)
    (site / "templates" / "sbatch.sh.j2").write_text(
        '{% extends "hpctrain/sbatch.sh.j2" %}\n{% block header %}#SBATCH --nodes=4\n{% endblock %}\n'
    )
    monkeypatch.setenv(jobenv.SITE_PATH, str(site))
    with pytest.raises(UserError, match="mismatched topology"):
        golden_script("loopback")


def test_sandbox_and_strict_undefined(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "templates").mkdir(parents=True)
    tpl = site / "templates" / "sbatch.sh.j2"
    monkeypatch.setenv(jobenv.SITE_PATH, str(site))
    tpl.write_text("{{ no_such_value }}\n")
    with pytest.raises(UserError, match="no_such_value"):
        golden_script("local")
    tpl.write_text("{{ job.__class__.__mro__ }}\n")
    with pytest.raises(UserError, match="unsafe|__class__"):
        golden_script("local")


# -- executing rendered scripts with stand-ins at the subprocess boundary ------------------------

STANDIN_PYTHON = f"""#!{sys.executable}
# Stand-in for the node python: records torchrun's argv and environment; real python for -c checks.
import json, os, sys
if sys.argv[1:2] == ["-c"]:
    os.execv({sys.executable!r}, [{sys.executable!r}, *sys.argv[1:]])
rec = os.environ["RECORD"]
with open(os.path.join(rec, "node-" + os.environ[{jobenv.NODEID!r}] + ".json"), "w") as f:
    json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, f)
sys.exit(int(os.environ.get("STANDIN_EXIT", "0")))
"""
STANDIN_SRUN = """#!/bin/bash
# Stand-in srun: drop srun options, run the command once per node with SLURM_NODEID set.
echo "$@" >"$RECORD/srun.args"
while [ "${1#-}" != "$1" ]; do shift; done
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i "$@" & pids+=($!); done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc
"""
STANDIN_SCONTROL = """#!/bin/bash
echo "$@" >>"$RECORD/scontrol.calls"
if [ "$1 $2" = "show hostnames" ]; then echo localhost; echo otherhost; fi
"""


@pytest.fixture
def standins(tmp_path):
    return make_standins(tmp_path)


def make_standins(tmp_path):
    bin_ = tmp_path / "bin"
    rec = tmp_path / "record"
    bin_.mkdir()
    rec.mkdir()
    for name, text in (
        ("python", STANDIN_PYTHON),
        ("srun", STANDIN_SRUN),
        ("scontrol", STANDIN_SCONTROL),
    ):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    return bin_, rec


def run_script(text: str, standins, *, env: dict[str, str] | None = None, timeout: float = 60):
    bin_, rec = standins
    script = rec.parent / "job.sh"
    script.write_text(text)
    full = {
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "RECORD": str(rec),
        "HOME": str(rec.parent),
        jobenv.PYTHON: str(bin_ / "python"),
        **(env or {}),
    }
    return subprocess.run(
        ["bash", str(script)], env=full, capture_output=True, text=True, timeout=timeout
    )


def render_with(profile_name, flags, args, run_dir, standins, name="h"):
    os.environ[jobenv.PYTHON] = str(standins[0] / "python")
    # the stand-ins record commands; the preflight gate runs live (tests/test_bad_nodes.py)
    profile = resolve(profile_name, {"preflight.enabled": False, **flags})
    req = JobRequest.build(profile, name=name, nodes=2, gpus=1, args=args)
    return render(JobSpec.build(profile, req, run_dir))


SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"}


@pytest.mark.parametrize("scheduler", ["local", "loopback"])
def test_hostile_values_arrive_intact_and_inject_nothing(scheduler, tmp_path, standins):
    marks = tmp_path / "marks"
    marks.mkdir()
    args = [h.format(m=marks) for h in HOSTILE]
    # Environment values: a newline is refused by the profile schema (exit 2); the rest render safely.
    with pytest.raises(ValidationError, match="newline"):
        resolve(scheduler, {"environment.env.BAD": f"x\ntouch {marks}/env"})
    # Command substitution is refused by the value grammar (exit 2); the rest arrive as written.
    with pytest.raises(ValidationError, match="command substitution"):
        resolve(scheduler, {"environment.env.BAD": f"$(touch {marks}/env)"})
    env_values = {
        f"HOSTILE_{i}": h.format(m=marks)
        for i, h in enumerate(HOSTILE)
        if "\n" not in h and "$(" not in h and "`" not in h
    }
    flags = {f"environment.env.{k}": v for k, v in env_values.items()}
    # Paths with quotes, $(), spaces and non-ASCII: fine locally; Slurm's #SBATCH lines refuse them.
    run_dir = tmp_path / ("runs it's $(touch x) ü" if scheduler == "local" else "runs") / "h"
    text = render_with(scheduler, flags, args, str(run_dir), standins)
    out = run_script(text, standins, env=SLURM_ENV if scheduler == "loopback" else None)
    log = run_dir / "logs" / "batch.log"
    assert out.returncode == 0, out.stderr + (
        log.read_text(errors="replace") if log.exists() else ""
    )
    assert list(marks.iterdir()) == [], "an injected command ran"
    for node in (0, 1):
        rec = json.loads((standins[1] / f"node-{node}.json").read_text())
        argv = rec["argv"]
        assert argv[:2] == ["-m", "hpctrain.launchers.rdzv"]  # torchrun, signed rendezvous
        assert argv[-len(args) :] == args, "arguments did not arrive intact"
        assert argv[argv.index("--run-dir") + 1] == str(run_dir)
        for k, v in env_values.items():
            expect = v.replace("$HOME", str(tmp_path))  # $NAME is the one expansion allowed
            assert rec["env"][k] == expect
        assert rec["env"][jobenv.NODEID] == str(node)
        assert rec["env"][jobenv.RUN_DIR] == str(run_dir)
    assert (run_dir / "logs" / "node-1.log").is_file()
    restarts = [json.loads(x) for x in (run_dir / "restarts.jsonl").read_text().splitlines()]
    assert len(restarts) == 1 and restarts[0]["restart_count"] == 0


def test_per_node_values_read_on_the_node(tmp_path, standins):
    text = render_with("loopback", {}, [], str(tmp_path / "runs" / "h"), standins)
    out = run_script(text, standins, env=SLURM_ENV)
    assert out.returncode == 0, out.stderr
    recs = [json.loads((standins[1] / f"node-{n}.json").read_text()) for n in (0, 1)]
    hosts = [a for r in recs for a in r["argv"] if a.startswith("--rdzv-conf=")]
    assert hosts == ["--rdzv-conf=is_host=1", "--rdzv-conf=is_host=0"]
    endpoint = {a for r in recs for a in r["argv"] if a.startswith("--rdzv-endpoint=")}
    assert len(endpoint) == 1
    addr, port = endpoint.pop().split("=")[1].rsplit(":", 1)
    assert addr == "127.0.0.1"  # localhost through getent ahostsv4, the first host of the nodelist
    lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert 20000 <= int(port) < 32000 and int(port) != 29500 and not lo <= int(port) <= hi
    assert int(port) == 20000 + 4242 % 12000
    assert "--nnodes=2" in recs[0]["argv"] and "--nproc-per-node=1" in recs[0]["argv"]
    srun = (standins[1] / "srun.args").read_text()
    assert srun.startswith(
        "--nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 --cpus-per-task=1 bash -c"
    )


def test_port_policy_skips_29500_and_fails_in_ephemeral_range(tmp_path, standins):
    run_dir = tmp_path / "runs" / "h"
    flags = {"rendezvous.port_min": 29490, "rendezvous.port_max": 29510}
    text = render_with("loopback", flags, [], str(run_dir), standins)
    out = run_script(text, standins, env={**SLURM_ENV, "SLURM_JOB_ID": "10"})  # 29490 + 10 = 29500
    assert out.returncode == 0, out.stderr
    argv = json.loads((standins[1] / "node-0.json").read_text())["argv"]
    assert "--rdzv-endpoint=127.0.0.1:29501" in argv
    lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    if hi - lo < 100 or hi > 65000:
        pytest.fail(f"unexpected ephemeral range {lo}-{hi}")
    flags = {"rendezvous.port_min": lo + 10, "rendezvous.port_max": lo + 50}
    try:
        text = render_with("loopback", flags, [], str(run_dir), standins)
    except ValidationError:
        return  # the profile schema refuses a range inside the default ephemeral range: also fine
    out = run_script(text, standins, env=SLURM_ENV)
    assert out.returncode == 1
    assert "no free rendezvous port" in out.stderr and "ephemeral range" in out.stderr


# The entry's first start "trains" until the stop file appears (10 s at most), then does what a
# real entry does on a stop (exit 75 after its save) or what one that trained to its end does
# (exit 0).
AFTER_STOP = (
    "import time\n"
    f"if os.environ[{jobenv.RESTART_COUNT!r}] == '0':\n"
    "    for _ in range(100):\n"
    f"        if os.path.exists(os.environ[{jobenv.STOP_FILE!r}]): sys.exit({{code}})\n"
    "        time.sleep(0.1)\n"
    "sys.exit("
)


@pytest.mark.parametrize("code", [75, 0])
def test_local_preemption_relaunches_and_slurm_requeues(tmp_path, standins, code):
    """A USR2 during the run, the entry saves and leaves with 75: locally the script starts again
    with RESTART_COUNT+1; on Slurm it calls `scontrol requeue $SLURM_JOB_ID` from the batch shell.
    The entry leaves with 0 instead (it finished): COMPLETED at once, one start, no requeue."""
    bin_, rec = standins
    slow = bin_ / "python"
    slow.write_text(STANDIN_PYTHON.replace("sys.exit(", AFTER_STOP.format(code=code)))
    for scheduler, env in (("local", {}), ("loopback", SLURM_ENV)):
        run_dir = tmp_path / scheduler / "h"
        text = render_with(scheduler, {}, [], str(run_dir), standins)
        script = rec.parent / f"{scheduler}.sh"
        script.write_text(text)
        full = {
            "PATH": f"{bin_}:{os.environ['PATH']}",
            "RECORD": str(rec),
            "HOME": str(tmp_path),
            jobenv.PYTHON: str(slow),
            **env,
        }
        proc = subprocess.Popen(
            ["bash", str(script)], env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(100):
            if (rec / "node-0.json").exists():
                break
            subprocess.run(["sleep", "0.1"])
        proc.send_signal(12)  # USR2
        proc.communicate(timeout=60)
        events = [
            json.loads(x)["event"] for x in (run_dir / "events.jsonl").read_text().splitlines()
        ]
        starts = [json.loads(x) for x in (run_dir / "restarts.jsonl").read_text().splitlines()]
        (rec / "node-0.json").unlink()
        if code == 0:  # a run that finished is finished
            assert proc.returncode == 0 and events == ["signal", "done"], events
            calls = rec / "scontrol.calls"
            assert len(starts) == 1 and "requeue" not in (
                calls.read_text() if calls.exists() else ""
            )
            continue
        if scheduler == "local":
            assert proc.returncode == 0
            assert events == ["signal", "requeue", "done"]
            assert [s["restart_count"] for s in starts] == [0, 1]
            assert json.loads((run_dir / "state.json").read_text())["state"] == "COMPLETED"
        else:
            assert events == ["signal", "requeue"]
            assert "requeue 4242" in (rec / "scontrol.calls").read_text()
        assert not (run_dir / "STOP").exists() or scheduler == "loopback"


def test_missing_interface_fails_fast_naming_it(tmp_path, standins):
    run_dir = tmp_path / "runs" / "h"
    text = render_with(
        "local",
        {"network.gloo_socket_ifname": "nosuch0", "network.socket_ifname": "nosuch0"},
        [],
        str(run_dir),
        standins,
    )
    out = run_script(text, standins)
    assert out.returncode != 0
    log = (run_dir / "logs" / "node-0.log").read_text()
    assert "network interface nosuch0 (GLOO_SOCKET_IFNAME, from the profile) does not exist" in log
    assert not (standins[1] / "node-0.json").exists()  # torchrun never started
    assert json.loads((run_dir / "state.json").read_text())["state"] == "FAILED"
