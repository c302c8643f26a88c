"""Issue 20, item 3: what documented site recipes write and the schema refused or could not say: a
conda prefix env, Slurm's memory sizes, --mem-per-gpu, whole-node jobs without a GPU directive, an
NCCL transport the site's module chooses, arithmetic, other schedulers, short or underscored
options. Each either renders what the recipe says or is one located line naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from _trust_common import cli, write

from hpctrain.jobs.request import JobRequest
from hpctrain.jobs.spec import JobSpec
from hpctrain.kernel import jobenv
from hpctrain.kernel.errors import ValidationError
from hpctrain.profiles import resolve
from hpctrain.render.script import render


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "xdg"
    home.mkdir(mode=0o755)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    monkeypatch.setenv(jobenv.PYTHON, "/opt/py/bin/python")
    return home


def script(name: str, flags: dict, **req: int) -> str:
    profile = resolve(name, flags)
    return render(JobSpec.build(profile, JobRequest.build(profile, name="t", **req), "/tmp/runs/t"))


def sbatch(text: str) -> list[str]:
    return [ln.split()[1] for ln in text.splitlines() if ln.startswith("#SBATCH ")]


def test_conda_prefix_env_is_activated_by_its_path() -> None:
    text = script("local", {"environment.activate": "conda:/shared/envs/torch"})
    assert 'conda activate "/shared/envs/torch" ||' in text
    text = script("local", {"environment.activate": "conda:$WORK/envs/t"})
    assert 'conda activate "$WORK/envs/t" ||' in text
    assert "conda activate torch ||" in script("local", {"environment.activate": "conda:torch"})
    with pytest.raises(ValidationError, match=r"conda:/path/to/env"):
        resolve("local", {"environment.activate": "conda:a b"})
    with pytest.raises(ValidationError, match=r"activate .* contains shell syntax"):
        resolve("local", {"environment.activate": "conda:/x;id"})


@pytest.mark.parametrize("mem", ["128GB", "128gb", "480G", "512000M", "512000MB", "1T", "0", "64k"])
def test_memory_sizes_slurm_accepts(mem) -> None:
    assert f"--mem={mem}" in sbatch(script("loopback", {"slurm.mem": mem}))


@pytest.mark.parametrize("mem", ["128 GB", "-1G", "12P", "1.5G", "GB"])
def test_memory_sizes_slurm_refuses(mem) -> None:
    with pytest.raises(ValidationError, match=r"slurm.mem: .* is not a Slurm memory size"):
        resolve("loopback", {"slurm.mem": mem})


def test_mem_per_gpu_has_a_key_and_a_true_message() -> None:
    flags = {"slurm.mem_per_gpu": "64G", "slurm.gpus_per_node": 4}
    assert "--mem-per-gpu=64G" in sbatch(script("loopback", flags, nodes=1, gpus=4))
    with pytest.raises(ValidationError, match=r"mem and mem_per_gpu are both set"):
        resolve("loopback", {**flags, "slurm.mem": "0"})
    with pytest.raises(ValidationError, match=r"fix: set slurm.mem_per_gpu"):
        resolve("loopback", {"slurm.srun_args": ["--mem-per-gpu=64G"]})
    with pytest.raises(ValidationError, match=r"hpctrain has no per-CPU memory key"):
        resolve("loopback", {"slurm.extra_sbatch": ["--mem-per-cpu=4G"]})


def test_a_whole_node_job_may_write_no_gpu_directive() -> None:
    flags = {"slurm.gpus_per_node": 8, "slurm.gpu_request": "none", "slurm.exclusive": True}
    text = script("loopback", flags, nodes=2, gpus=8)
    lines = sbatch(text)
    assert "--exclusive" in lines and not any(x.startswith(("--gres", "--gpus")) for x in lines)
    assert f"export {jobenv.GPUS_PER_NODE}=8" in text  # still 8 workers per node
    with pytest.raises(ValidationError, match=r"gpu_request: Input should be"):
        resolve("loopback", {"slurm.gpu_request": "nothing"})


def test_network_ib_unset_leaves_the_transport_to_the_site() -> None:
    assert "NCCL_IB_DISABLE" not in script("loopback", {"network.ib": "unset"})
    assert 'export NCCL_IB_DISABLE="1"' in script("loopback", {"network.ib": False})
    assert 'export NCCL_IB_DISABLE="0"' in script("loopback", {"network.ib": True})
    p = resolve("loopback", {"network.ib": "unset", "network.ib_hca": "mlx5_0:1"})
    assert p.network.ib_hca == "mlx5_0:1"  # the site's NCCL reads it with its own transport
    with pytest.raises(ValidationError, match=r"network.ib: "):
        resolve("loopback", {"network.ib": "maybe"})


def test_arithmetic_is_named_as_arithmetic() -> None:
    with pytest.raises(ValidationError, match=r"uses arithmetic expansion \(\$\(\(...\)\)\)"):
        resolve("local", {"environment.env.X": "$((SLURM_NNODES * 8))"})
    with pytest.raises(ValidationError, match=r"command substitution"):
        resolve("local", {"environment.env.X": "$(hostname)"})


@pytest.mark.parametrize("value, name", [("pbs", "PBS Pro"), ("PBSPro", "PBS Pro"), ("lsf", "LSF")])
def test_other_schedulers_say_they_are_not_supported(tmp_path, value, name) -> None:
    path = write(tmp_path / "p" / "p.yaml", f"name: p\nscheduler: {value}\n")
    out = cli("profiles", "validate", str(path))
    assert out.exit_code == 2 and f"p.yaml:2: scheduler: '{value}': " in out.output, out.output
    assert f"{name} is not supported" in out.output and "scheduler: local" in out.output


@pytest.mark.parametrize(
    "key, option, fix",
    [
        ("slurm.srun_args", "--cpu_bind=none", "write --cpu-bind=none"),
        ("slurm.srun_args", "-ul", "write the long forms, one item each: --unbuffered, --label"),
        ("slurm.srun_args", "-u", "write the long form --unbuffered"),
        ("slurm.extra_sbatch", "-C", "short option -C is --constraint, which hpctrain sets itself; "
         "fix: set slurm.constraint"),
        ("slurm.extra_sbatch", "--Exclusive", "fix: set slurm.exclusive: true"),
    ],
)  # fmt: skip
def test_short_and_underscored_options_name_the_supported_spelling(key, option, fix) -> None:
    with pytest.raises(ValidationError, match=rf"{key}\[0\]: '{option}': .*{fix}"):
        resolve("loopback", {key: [option]})


def test_srun_options_that_apply_only_when_a_path_exists_on_the_node(tmp_path) -> None:
    import subprocess

    flags = {"slurm.srun_args_if_exists": {"$MARK/cluster": ["--auto-resume=1"]}}
    text = script("loopback", flags)
    line = next(ln for ln in text.splitlines() if "slurm.srun_args_if_exists" in ln)
    probe = f"hpctrain_launch=(srun)\n{line}\nprintf '%s\\n' \"${{hpctrain_launch[@]}}\"\n"
    for exists in (False, True):
        if exists:
            (tmp_path / "cluster").mkdir()
        out = subprocess.run(
            ["bash", "-c", probe], env={"MARK": str(tmp_path)}, capture_output=True, text=True
        )
        assert out.stdout.split() == (["srun", "--auto-resume=1"] if exists else ["srun"])
    with pytest.raises(ValidationError, match=r"hpctrain sets --partition itself"):
        resolve("loopback", {"slurm.srun_args_if_exists": {"/x": ["--partition=big"]}})
    with pytest.raises(ValidationError, match=r"is relative"):
        resolve("loopback", {"slurm.srun_args_if_exists": {"x": ["--auto-resume=1"]}})
    with pytest.raises(ValidationError, match=r"is not a safe sbatch option"):
        resolve("loopback", {"slurm.extra_sbatch": ["$(test -d /x && echo --auto-resume=1)"]})
