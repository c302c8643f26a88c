"""Site profile keys that need no cluster: each rendered script is EXECUTED with stand-ins at the
process boundary (srun, scontrol, the node python from tests/test_render.py; rocm-smi from
tests/standins/), so what the node does is checked, not only the text.

    .venv/bin/python -m pytest -q tests/test_sites.py
"""

# ruff: noqa: F811  (pytest fixtures imported from tests/test_render.py)
from __future__ import annotations

import json
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
from hpctrain.render.script import render
from tests.test_render import SLURM_ENV, isolated, run_script, standins  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parent.parent
STANDINS = REPO / "tests" / "standins"


def script(
    name: str, flags: dict, run_dir: Path, bin_: Path, *, nodes: int = 2, gpus: int = 1
) -> str:
    import os

    # the stand-in python for this render only: a live job of a later test in this process must
    # get the real one
    before = os.environ.get(jobenv.PYTHON)
    os.environ[jobenv.PYTHON] = str(bin_ / "python")
    try:
        # the stand-ins record commands; the preflight gate runs live (tests/test_bad_nodes.py)
        profile = resolve(name, {"preflight.enabled": False, **flags})
        req = JobRequest.build(profile, name="s", nodes=nodes, gpus=gpus, args=[])
        return render(JobSpec.build(profile, req, run_dir))
    finally:
        if before is None:
            os.environ.pop(jobenv.PYTHON, None)
        else:
            os.environ[jobenv.PYTHON] = before


def node_env(rec: Path, node: int = 0) -> dict:
    return json.loads((rec / f"node-{node}.json").read_text())["env"]


def test_amd_node_detected_by_rocm_smi(tmp_path, standins):
    bin_, rec = standins
    assert shutil.which("nvidia-smi") is None and not Path("/dev/kfd").exists()
    text = script("loopback", {}, tmp_path / "runs" / "s", bin_)
    gpus = {"CUDA_VISIBLE_DEVICES": "0,1"}
    out = run_script(text, standins, env={**SLURM_ENV, **gpus})
    assert out.returncode == 0, out.stderr
    assert node_env(rec)[jobenv.DEVICE] == "cpu"  # no GPU tool: a CPU node, said so
    shutil.copy(STANDINS / "rocm-smi", bin_ / "rocm-smi")
    shutil.copy(STANDINS / "_record.sh", bin_ / "_record.sh")
    out = run_script(text, standins, env={**SLURM_ENV, **gpus})
    assert out.returncode == 0, out.stderr
    env = node_env(rec)
    assert env[jobenv.DEVICE] == "cuda"  # torch's name for HIP too; nccl = RCCL
    assert env["ROCR_VISIBLE_DEVICES"] == "0,1" and "CUDA_VISIBLE_DEVICES" not in env
    assert "ACCELERATE_USE_CPU" not in env
    log = (tmp_path / "runs" / "s" / "logs" / "node-0.log").read_text()
    assert "device=cuda gpu=amd" in log


def test_gloo_prefix_is_resolved_to_the_nodes_interface(tmp_path, standins):
    bin_, rec = standins
    flags = {"network.socket_ifname": "l", "network.gloo_socket_ifname": None}
    text = script("local", flags, tmp_path / "a" / "s", bin_)
    assert "GLOO_SOCKET_IFNAME=" not in text.split("hpctrain_node_cmd=")[0]  # not the raw prefix
    out = run_script(text, standins)
    assert out.returncode == 0, out.stderr
    assert node_env(rec)["GLOO_SOCKET_IFNAME"] == "lo"
    flags["network.socket_ifname"] = "hsn"
    text = script("local", flags, tmp_path / "b" / "s", bin_)
    out = run_script(text, standins)
    assert out.returncode != 0
    log = (tmp_path / "b" / "s" / "logs" / "node-0.log").read_text()
    assert "no network interface matches hsn (network.socket_ifname, from the profile)" in log


def test_a_failed_module_command_stops_the_job_naming_it(tmp_path, standins):
    bin_, rec = standins
    setup = ['module() { echo "module $*" >>"$HOME/modules.log"; [ "$2" != missing/1.0 ]; }']
    flags = {
        "environment.setup": setup,
        "environment.modules": ["purge", "use $HOME/mods", "ok/1", "missing/1.0", "never/2"],
    }
    run_dir = tmp_path / "runs" / "s"
    out = run_script(script("local", flags, run_dir, bin_), standins)
    assert out.returncode == 1
    assert (
        "module load missing/1.0 failed (exit 1): check environment.modules of profile local"
        in (run_dir / "logs" / "batch.log").read_text()
    )
    done = (tmp_path / "modules.log").read_text().splitlines()
    assert done == [
        "module purge",
        f"module use {tmp_path}/mods",
        "module load ok/1",
        "module load missing/1.0",
    ]  # $HOME expanded, stopped there
    assert not (rec / "node-0.json").exists()  # nothing was launched
    assert json.loads((run_dir / "state.json").read_text())["state"] == "FAILED"


def test_value_grammar_defaults_mixed_case_and_task_variables(tmp_path, standins):
    bin_, rec = standins
    flags = {
        "network.env.FI_PROVIDER": "${FI_PROVIDER:-cxi}",
        "environment.env.PMIX_MCA_psec": "native",
        "environment.env.CACHE": "${SCRATCH:-/tmp}/$USER-miopen",
        "environment.task_env.CUDA_VISIBLE_DEVICES": "3,2,1,0",
        "environment.task_setup": [f"export TASK_MARK=node-${jobenv.NODEID}"],
    }
    text = script("local", flags, tmp_path / "a" / "s", bin_)
    assert (
        'export FI_PROVIDER="${FI_PROVIDER:-cxi}"' in text
        and 'export PMIX_MCA_psec="native"' in text
    )
    out = run_script(text, standins, env={"USER": "ann"})
    assert out.returncode == 0, out.stderr
    for node in (0, 1):
        env = node_env(rec, node)
        assert env["FI_PROVIDER"] == "cxi" and env["PMIX_MCA_psec"] == "native"
        assert env["CACHE"] == "/tmp/ann-miopen"
        assert env["CUDA_VISIBLE_DEVICES"] == "3,2,1,0" and env["TASK_MARK"] == f"node-{node}"
    out = run_script(text, standins, env={"FI_PROVIDER": "verbs", "SCRATCH": "/s", "USER": "ann"})
    assert node_env(rec)["FI_PROVIDER"] == "verbs" and node_env(rec)["CACHE"] == "/s/ann-miopen"


@pytest.mark.parametrize("value", ["$(hostname)", "`id`", "a$", "${X:-$(id)}", "${X:-a}b$1"])
def test_value_grammar_refuses_what_would_run_or_mislead(value):
    with pytest.raises(ValidationError, match=r"command substitution|a \$ that is not"):
        resolve("local", {"environment.env.X": value})


def test_null_in_a_child_removes_an_inherited_entry(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(
        "name: base\nscheduler: local\nenvironment:\n  env: {KEEP: '1', DROP: '2'}\n"
        "network:\n  env: {NCCL_DEBUG: INFO}\n"
    )
    child = tmp_path / "child.yaml"
    child.write_text(
        "name: child\nextends: ./base.yaml\nenvironment:\n  env: {DROP: null}\n"
        "network:\n  env: {NCCL_DEBUG: null}\n"
    )
    for p in (base, child):
        p.chmod(0o644)
    p = resolve(str(child), {})
    assert p.environment.env == {"KEEP": "1"} and p.network.env == {}


def test_port_29500_only_when_named(tmp_path, standins):
    with pytest.raises(ValidationError, match=r"holds only 29500.*fix: write `port: 29500`"):
        resolve("loopback", {"rendezvous.port_min": 29500, "rendezvous.port_max": 29501})
    bin_, rec = standins
    text = script("loopback", {"rendezvous.port": 29500}, tmp_path / "runs" / "s", bin_)
    out = run_script(text, standins, env=SLURM_ENV)
    assert out.returncode == 0, out.stderr
    argv = json.loads((rec / "node-0.json").read_text())["argv"]
    assert "--rdzv-endpoint=127.0.0.1:29500" in argv


def test_rendezvous_head_from_an_interface(tmp_path, standins):
    bin_, rec = standins
    text = script("loopback", {"rendezvous.interface": "lo"}, tmp_path / "runs" / "s", bin_)
    assert "ip -4 -o addr show dev lo" in text and "getent ahostsv4" not in text
    out = run_script(text, standins, env={**SLURM_ENV, "SLURM_JOB_NODELIST": "nosuchhost[1-2]"})
    assert out.returncode == 0, out.stderr
    argv = json.loads((rec / "node-0.json").read_text())["argv"]
    assert any(a.startswith("--rdzv-endpoint=127.0.0.1:") for a in argv), argv


def test_what_validates_renders_and_single_node_directives(tmp_path, standins):
    bin_, _ = standins
    flags = {
        "slurm.constraint": "a100&ib",
        "slurm.single_node_sbatch": ["--network=single_node_vni"],
    }
    text = script("loopback", flags, tmp_path / "r" / "s", bin_, nodes=2)
    assert "#SBATCH --constraint=a100&ib\n" in text and "single_node_vni" not in text
    text = script("loopback", flags, tmp_path / "r" / "t", bin_, nodes=1)
    assert "#SBATCH --network=single_node_vni\n" in text


def test_launcher_srun_renders_one_task_per_gpu(tmp_path, standins):
    bin_, _ = standins
    text = script(
        "loopback",
        {"launch.launcher": "srun", "launch.task_gpus": "gpus-per-task"},
        tmp_path / "r" / "s",
        bin_,
        gpus=2,
    )
    assert (
        "#SBATCH --ntasks-per-node=2\n#SBATCH --gpus-per-node=2\n#SBATCH --cpus-per-task=1\n"
        in text
    )
    assert f'srun --nodes="${jobenv.NNODES}" --ntasks-per-node=2 --kill-on-bad-exit=1' in text
    assert "hpctrain_launch+=(--gpus-per-task=1)" in text and "hpctrain.launchers.rdzv" not in text
    assert "export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS" in text
    gres = script(
        "loopback",
        {"launch.launcher": "srun", "launch.task_gpus": "gpu-bind", "slurm.gpu_request": "gres"},
        tmp_path / "r" / "g",
        bin_,
        gpus=2,
    )
    assert "#SBATCH --gres=gpu:2\n" in gres and "hpctrain_launch+=(--gpu-bind=single:1)" in gres
    with pytest.raises(ValidationError, match="launch.launcher srun needs scheduler slurm"):
        resolve("local", {"launch.launcher": "srun"})


def test_torchrun_command_arguments_and_python_keys(tmp_path, standins):
    bin_, _ = standins
    flags = {
        "launch.torchrun": "python -m torch.distributed.run",
        "launch.python": "$CONDA_PREFIX/bin/python",
        "launch.torchrun_args": ["--numa-binding=exclusive", "--local-addr=${HOSTNAME}i"],
    }
    text = script("loopback", flags, tmp_path / "r" / "s", bin_)
    assert f'export {jobenv.PYTHON}="$CONDA_PREFIX/bin/python"\n' in text  # expands on the node
    # a resume renders with run.yaml's node_python: the same script
    profile = resolve("loopback", {"preflight.enabled": False, **flags})
    again = render(
        JobSpec.build(
            profile,
            JobRequest.build(profile, name="s", nodes=2, gpus=1, args=[]),
            tmp_path / "r" / "s",
            python="$CONDA_PREFIX/bin/python",
        )
    )
    assert again == text
    assert ('exec "python" "-m" "torch.distributed.run" --nnodes=') in text
    assert (
        '--max-restarts=2 --monitor-interval=0.5 --numa-binding="exclusive" --local-addr="${HOSTNAME}i" "${tee[@]}"'
        in text
    )
    for bad, why in (
        ({"launch.torchrun_args": ["--nnodes=4"]}, "hpctrain sets --nnodes itself"),
        ({"launch.torchrun": "-m torchrun"}, "not a plain command word"),
        ({"launch.torchrun_args": ["--x=$(id)"]}, "not a safe torchrun option"),
    ):
        with pytest.raises(ValidationError, match=why):
            resolve("loopback", bad)


def test_name_yml_beside_name_yaml_is_an_error(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    for suffix in ("yaml", "yml"):
        (site / f"twin.{suffix}").write_text("name: twin\nscheduler: local\n")
        (site / f"twin.{suffix}").chmod(0o644)
    site.chmod(0o755)
    monkeypatch.setenv(jobenv.SITE_PATH, str(site))
    with pytest.raises(
        UserError,
        match=r"twin.yaml:1: name: both twin.yaml and twin.yml are in .*"
        "fix: delete one of them",
    ):
        resolve("twin", {})
    out = subprocess.run(
        [sys.executable, "-m", "hpctrain", "profiles", "show", "twin"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "both twin.yaml and twin.yml" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_profile_chooses_its_template(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "templates").mkdir(parents=True)
    tpl = site / "templates" / "mysite.sh.j2"
    tpl.write_text(
        '{% extends "hpctrain/sbatch.sh.j2" %}\n'
        "{% block setup %}{{ super() | safe }}export SITE_MARK=1\n{% endblock %}\n"
    )
    for name, extra in (("with-tpl", "template: mysite.sh.j2\n"), ("without", "")):
        (site / f"{name}.yaml").write_text(f"name: {name}\nextends: local\n{extra}")
    for p in (site, site / "templates", tpl, *site.glob("*.yaml")):
        p.chmod(0o755 if p.is_dir() else 0o644)
    monkeypatch.setenv(jobenv.SITE_PATH, str(site))
    monkeypatch.setenv(jobenv.PYTHON, "/x/python")
    texts = {}
    for name in ("with-tpl", "without"):
        p = resolve(name, {})
        req = JobRequest.build(p, name="t")
        texts[name] = render(JobSpec.build(p, req, tmp_path / "runs" / "t"))
    assert "export SITE_MARK=1\n" in texts["with-tpl"] and "SITE_MARK" not in texts["without"]
    with pytest.raises(ValidationError, match="not a template file name"):
        resolve("local", {"template": "../x.j2"})


@pytest.mark.parametrize(
    "text, where",
    [
        (
            "environment:\n  container: {kind: apptainer, image: a.sif, env: [X]}\n",
            ":3: environment.container.env: container.env is a pyxis option",
        ),
        (
            "environment:\n  container: {kind: shifter, image: $IMG}\n",
            ":3: environment.container.image: a shifter image is an #SBATCH line",
        ),
        (
            "environment:\n  modules: [purge all]\n",
            ":3: environment.modules[0]: module 'purge all'",
        ),
        ("launch:\n  launcher: mpirun\n", ":3: launch.launcher:"),
        ("rendezvous:\n  host_suffix: 'i b'\n", ":3: rendezvous.host_suffix:"),
        (
            "environment:\n  env: {X: $(id)}\n",
            ":3: environment.env.X: '$(id)' uses command substitution",
        ),
    ],
)
def test_bad_new_keys_are_one_located_line_and_exit_2(tmp_path, text, where):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\n" + text)
    path.chmod(0o644)
    out = subprocess.run(
        [sys.executable, "-m", "hpctrain", "profiles", "validate", str(path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"{path}{where}" in out.stdout + out.stderr, out.stdout + out.stderr
    assert "Traceback" not in out.stderr


def test_profiles_diff_shows_changed_keys_and_the_script_diff(tmp_path):
    new = tmp_path / "loopback.yaml"
    new.write_text("name: loopback\nextends: loopback\nlaunch:\n  launcher: srun\n")
    new.chmod(0o644)
    run = [sys.executable, "-m", "hpctrain", "profiles", "diff"]
    out = subprocess.run([*run, "loopback", str(new)], capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    assert f'launch.launcher: "torchrun" (default) -> "srun" ({new}:4)' in out.stdout
    assert "-#SBATCH --ntasks-per-node=1\n+#SBATCH --ntasks-per-node=2\n" in out.stdout
    assert "+export RANK=$SLURM_PROCID" in out.stdout
    same = subprocess.run([*run, "loopback", "loopback", "--json"], capture_output=True, text=True)
    assert same.returncode == 0 and json.loads(same.stdout)["same_script"] is True


def test_the_publishing_guide_profile_validates(tmp_path):
    text = (REPO / "docs" / "publishing-a-site.md").read_text()
    block = text.split("## 2. Write the profile")[1].split("```yaml\n")[1].split("```")[0]
    path = tmp_path / "mycluster.yaml"
    path.write_text(block)
    path.chmod(0o644)
    p = resolve(str(path), {})
    assert p.environment.modules == ["purge", "load GCC/13.2.0 CUDA/12.4 NCCL/2.21"]
    assert "environment.setup" in p.locked


STANDIN_SRUN_TASKS = """#!/bin/bash
# Stand-in srun: --ntasks-per-node tasks on each "node", with the variables real srun gives a task.
echo "$@" >"$RECORD/srun.args"
per=1
while [ "${1#-}" != "$1" ]; do
  case $1 in --ntasks-per-node=*) per=${1#*=} ;; esac
  shift
done
pids=(); n=0
for ((node = 0; node < SLURM_NNODES; node++)); do
  for ((t = 0; t < per; t++)); do
    SLURM_NODEID=$node SLURM_PROCID=$n SLURM_LOCALID=$t SLURM_NTASKS=$((SLURM_NNODES * per)) "$@" &
    pids+=($!); n=$((n + 1))
  done
done
rc=0; for p in "${pids[@]}"; do wait "$p" || rc=$?; done; exit $rc
"""
USER_SCRIPT = """
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")          # env:// from what the task set: no torchrun agent
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
with open(os.path.join(sys.argv[1], f"rank-{dist.get_rank()}.txt"), "w") as f:
    f.write(f"{dist.get_world_size()} {int(t.item())} {os.environ['LOCAL_RANK']} {os.environ['GROUP_RANK']}")
sys.stdout.flush()
os._exit(0)  # no destroy_process_group: gloo's may hang a rank (train_entry/compat.py)
"""


def test_a_user_script_runs_under_launcher_srun(tmp_path, standins, monkeypatch):
    bin_, rec = standins
    (bin_ / "srun").write_text(STANDIN_SRUN_TASKS)
    user = tmp_path / "user.py"
    user.write_text(USER_SCRIPT)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    monkeypatch.setenv(jobenv.PYTHON, sys.executable)
    profile = resolve("loopback", {"launch.launcher": "srun"})
    req = JobRequest.build(
        profile, name="u", nodes=2, gpus=1, script=str(user), args=[str(out_dir)]
    )
    text = render(JobSpec.build(profile, req, tmp_path / "runs" / "u"))
    # a real gloo job (gate + 2 ranks importing torch): 25 s at load 6, over 135 s at load 27
    out = run_script(text, standins, env={**SLURM_ENV, jobenv.PYTHON: sys.executable}, timeout=420)
    logs = "".join(p.read_text() for p in (tmp_path / "runs" / "u" / "logs").glob("*.log"))
    assert out.returncode == 0, out.stderr + logs
    assert "--ntasks-per-node=1" in (rec / "srun.args").read_text()
    results = sorted(p.read_text() for p in out_dir.glob("rank-*.txt"))
    assert results == ["2 3 0 0", "2 3 0 1"], results  # world 2, all-reduce 1+2, local 0, nodes 0/1


def test_activation_happens_inside_the_container_in_every_task(tmp_path, standins):
    bin_, rec = standins
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f'export VENV_ACTIVE="inside-${jobenv.NODEID}"\n')
    shutil.copy(STANDINS / "apptainer", bin_ / "apptainer")
    shutil.copy(STANDINS / "_record.sh", bin_ / "_record.sh")
    flags = {
        "environment.activate": str(venv),
        "environment.container": {"kind": "apptainer", "image": "/img.sif"},
    }
    text = script("loopback", flags, tmp_path / "runs" / "s", bin_)
    batch_part = text.split("hpctrain_node_cmd=")[0]
    assert "bin/activate" not in batch_part  # not in the batch shell (outside)
    out = run_script(text, standins, env=SLURM_ENV)
    assert out.returncode == 0, out.stderr
    assert [node_env(rec, n)["VENV_ACTIVE"] for n in (0, 1)] == ["inside-0", "inside-1"]
