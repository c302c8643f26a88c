"""site_configs/examples/: profiles of real clusters, modelled on their public documentation (each
file's header cites its pages). Each renders with a fixed request (2 nodes, the profile's GPUs) and
must carry the lines the site documents, with exact quoting: sbatch options, module commands, the
container call, every documented variable, the launch line. All validate, pass bash -n and
shellcheck, and render the same twice.

    .venv/bin/python -m pytest -q tests/test_site_examples.py
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from _profiles_common import cli, write

from hpctrain.jobs.request import JobRequest
from hpctrain.jobs.spec import JobSpec
from hpctrain.kernel import jobenv
from hpctrain.profiles import resolve
from hpctrain.render.script import render

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "site_configs" / "examples"
RUN = "/scratch/runs/demo"
TORCHRUN_FLAGS = (
    f'--nnodes="${jobenv.NNODES}" --nproc-per-node="${jobenv.GPUS_PER_NODE}" '
    f'--rdzv-backend=hpctrain --rdzv-endpoint="${jobenv.RDZV_ENDPOINT}" '
    f'--rdzv-id="${jobenv.JOB_ID}" --rdzv-conf="is_host=$is_host" --max-restarts=2 --monitor-interval=0.5 '
    '"${tee[@]}" "$@"'
)
SRUN_TASK = [
    "export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS",
    f"export MASTER_ADDR=${{{jobenv.RDZV_ENDPOINT}%:*}} MASTER_PORT=${{{jobenv.RDZV_ENDPOINT}##*:}}",
    f'"${jobenv.PYTHON}" "$@"',
]
GETENT = ["hpctrain_head_addr=$(getent ahostsv4 \"$hpctrain_head\" | awk 'NR == 1 {print $1}')"]

# example -> every line it must render (stripped of indentation), in the site's own terms
EXPECT = {
    "lumi-rocm-singularity": [
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=7",
        "#SBATCH --mem=0",
        "#SBATCH --partition=standard-g",
        "#SBATCH --account=project_465000000",
        "#SBATCH --exclusive",
        "hpctrain_module purge",
        'export NCCL_SOCKET_IFNAME="hsn0,hsn1,hsn2,hsn3"',
        'export FI_CXI_DEFAULT_CQ_SIZE="131072"',
        'export FI_PROVIDER="${FI_PROVIDER:-cxi}"',
        'export NCCL_NET_GDR_LEVEL="PHB"',
        'export ROCR_VISIBLE_DEVICES="$SLURM_LOCALID"',
        'export MIOPEN_USER_DB_PATH="/tmp/$USER-miopen-cache-$SLURM_NODEID"',
        f'hpctrain_launch=(srun --nodes="${jobenv.NNODES}" --ntasks-per-node=8 --kill-on-bad-exit=1)',
        'hpctrain_launch+=(singularity exec --rocm --bind "/pfs:/pfs" --bind "/scratch:/scratch" '
        '--bind "/projappl:/projappl" --bind "/flash:/flash" --bind "/scratch/runs/demo:/scratch/runs/demo" '
        '"$PROJECT_DIR/containers/pytorch-rocm.sif")  # environment.container (singularity)',
        f'export {jobenv.PYTHON}="python3"',
        *SRUN_TASK,
        *GETENT,
    ],
    "perlmutter-shifter": [
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --cpus-per-task=32",
        "#SBATCH --constraint=gpu",
        "#SBATCH --account=m0000",
        "#SBATCH --qos=regular",
        "#SBATCH --image=nersc/pytorch:25.02.01",
        "#SBATCH --module=gpu,nccl-plugin",
        "hpctrain_port=29500  # rendezvous.port: fixed by the profile",
        'export NCCL_SOCKET_IFNAME="hsn"',
        'hpctrain_launch+=(shifter --volume="$SCRATCH:/scratch" --volume="/scratch/runs/demo:/scratch/runs/demo")'
        "  # environment.container (shifter)",
        *SRUN_TASK,
        *GETENT,
    ],
    "alps-edf": [
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --cpus-per-task=72",
        "#SBATCH --partition=normal",
        "#SBATCH --account=a-g000",
        'export FI_PROVIDER="${FI_PROVIDER:-cxi}"',
        'export NCCL_CROSS_NIC="1"',
        'export FI_CXI_DISABLE_HOST_REGISTER="1"',
        'export FI_MR_CACHE_MONITOR="userfaultfd"',
        'hpctrain_launch+=(--environment="pytorch")  # environment.container (edf)',
        *SRUN_TASK,
    ],
    "olivia-slingshot-apptainer": [
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --cpus-per-task=72",
        "#SBATCH --mem=440G",
        "#SBATCH --partition=accel",
        "#SBATCH --account=nn0000k",
        "hpctrain_module reset",
        "hpctrain_module load NRIS/GPU",
        "hpctrain_module load NCCL/2.26.6-GCCcore-14.2.0-CUDA-12.8.0",
        'hpctrain_module use "/cluster/work/support/pytorch_module"',
        'export PYTORCH_OVERLAY_MODE="ro"',
        "hpctrain_port=29500  # rendezvous.port: fixed by the profile",
        'hpctrain_launch+=(apptainer exec --nv --bind "/cluster:/cluster" --bind "/scratch/runs/demo:'
        '/scratch/runs/demo" "/cluster/work/support/containers/pytorch.sif")  # environment.container (apptainer)',
        f'exec "${jobenv.PYTHON}" -m hpctrain.launchers.rdzv {TORCHRUN_FLAGS}',
    ],
    "juwels-booster": [
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gres=gpu:4",
        "#SBATCH --cpus-per-task=48",
        "#SBATCH --mem=0",
        "#SBATCH --partition=booster",
        "#SBATCH --account=training0000",
        "#SBATCH --threads-per-core=1",
        "hpctrain_module load Stages/2024",
        "hpctrain_module load GCC",
        'eval "$(conda shell.bash hook)" || hpctrain_fail '
        '"conda is not available to activate the profile\'s environment"',
        'conda activate train || hpctrain_fail "cannot activate the conda environment"',
        'export NCCL_SOCKET_IFNAME="ib0"',
        'export GLOO_SOCKET_IFNAME="ib0"',
        'export NCCL_IB_DISABLE="0"',
        'export NCCL_IB_TIMEOUT="20"',
        "hpctrain_head=${hpctrain_head}i  # rendezvous.host_suffix: the site's name for that network",
        f'exec "torchrun_jsc" {TORCHRUN_FLAGS}',
        *GETENT,
    ],
    "vega-ib-conda": [
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gres=gpu:4",
        "#SBATCH --cpus-per-task=64",
        "#SBATCH --mem=0",
        "#SBATCH --partition=gpu",
        "hpctrain_module purge",
        "hpctrain_module load Anaconda3",
        'conda activate ddp || hpctrain_fail "cannot activate the conda environment"',
        'export NCCL_SOCKET_IFNAME="ib0"',
        'export NCCL_IB_DISABLE="0"',
        'export NCCL_IB_HCA="mlx5"',
        'export NCCL_IB_TIMEOUT="22"',
        "hpctrain_launch+=(--cpus-per-task=64)",
        f'exec "${jobenv.PYTHON}" -m hpctrain.launchers.rdzv {TORCHRUN_FLAGS}',
    ],
    "aws-parallelcluster-efa-pyxis": [
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=192",
        "#SBATCH --exclusive",
        "#SBATCH --partition=p5",
        'export FI_PROVIDER="efa"',
        'export FI_EFA_USE_DEVICE_RDMA="1"',
        'export FI_EFA_FORK_SAFE="1"',
        'export NCCL_PROTO="simple"',
        'export NCCL_SOCKET_IFNAME="^docker,lo,veth"',
        'export NCCL_IB_DISABLE="1"',
        "hpctrain_launch+=(--cpu-bind=none)",
        'hpctrain_launch+=(--container-image="/fsx/apps/pytorch-25.06.sqsh" --container-mounts="/fsx:/fsx,'
        '/scratch/runs/demo:/scratch/runs/demo" --container-workdir="/fsx" '
        '--container-env="FI_PROVIDER,NCCL_PROTO")  # environment.container (pyxis)',
        f'exec "${jobenv.PYTHON}" -m hpctrain.launchers.rdzv {TORCHRUN_FLAGS}',
    ],
    "azure-ndv5-pyxis": [
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=96",
        "#SBATCH --exclusive",
        'export NCCL_TOPO_FILE="/opt/microsoft/ndv5-topo.xml"',
        'export NCCL_IB_PCI_RELAXED_ORDERING="1"',
        'export UCX_IB_PCI_RELAXED_ORDERING="on"',
        'export CUDA_DEVICE_ORDER="PCI_BUS_ID"',
        'export NCCL_SOCKET_IFNAME="eth0"',
        'export GLOO_SOCKET_IFNAME="eth0"',
        'export NCCL_IB_DISABLE="0"',
        'hpctrain_launch+=(--container-image="nvcr.io#nvidia/pytorch:25.06-py3" --container-mounts='
        '"/opt/microsoft:/opt/microsoft:ro,/shared:/shared,/scratch/runs/demo:/scratch/runs/demo")'
        "  # environment.container (pyxis)",
        f'exec "${jobenv.PYTHON}" -m hpctrain.launchers.rdzv {TORCHRUN_FLAGS}',
    ],
    # issue 34: six more clusters (slurm.gpu_type, preemption.signal TERM, environment.login_shell)
    "c3se-alvis": [
        "#SBATCH --gpus-per-node=A100:4",  # the typed request: A40 nodes have no InfiniBand
        "#SBATCH --cpus-per-task=64",
        "#SBATCH --partition=alvis",
        "#SBATCH --account=NAISS2025-22-0000",
        "hpctrain_module purge",
        'export NCCL_IB_DISABLE="0"',
        'hpctrain_launch+=(singularity exec --nv --bind "/mimer:/mimer" --bind "/scratch/runs/demo:'
        '/scratch/runs/demo" "/apps/containers/PyTorch/PyTorch-NGC-25.06.sif")'
        "  # environment.container (singularity)",
    ],
    "csc-roihu": [
        "#SBATCH --gres=gpu:gh200:4",
        "#SBATCH --cpus-per-task=288",
        "#SBATCH --mem=480G",
        "#SBATCH --partition=gpumedium",
        "#SBATCH --account=project_2000000",
        "hpctrain_module load pytorch",
        'source "/projappl/project_2000000/hpctrain-venv"/bin/activate || hpctrain_fail '
        '"cannot activate the profile\'s virtual environment"',
        'export NCCL_IB_DISABLE="0"',
    ],
    "ncsa-delta": [
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpuA100x4-preempt",
        "#SBATCH --signal=B:TERM@300",  # preemption.signal TERM: the site's SIGTERM is the warning
        "#SBATCH --requeue",
        "trap 'hpctrain_on_signal TERM' TERM",
        "#SBATCH --account=bxyz-delta-gpu",
        'conda activate train || hpctrain_fail "cannot activate the conda environment"',
        'export NCCL_SOCKET_IFNAME="hsn"',
        'export NCCL_IB_DISABLE="1"',
    ],
    "fasrc-cannon": [
        "#SBATCH --gres=gpu:4",
        "#SBATCH --cpus-per-task=64",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=my_lab",
        "hpctrain_module load python",
        'conda activate train || hpctrain_fail "cannot activate the conda environment"',
        'export NCCL_IB_DISABLE="0"',
    ],
    "surf-snellius": [
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --cpus-per-task=64",
        "#SBATCH --partition=gpu_h100",
        "hpctrain_module load 2024",
        "hpctrain_module load Python/3.12.3-GCCcore-13.3.0",
        'source "$HOME/venvs/hpctrain"/bin/activate || hpctrain_fail '
        '"cannot activate the profile\'s virtual environment"',
    ],
    "pdc-dardel": [
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=naiss2025-22-0000",
        "#SBATCH --exclusive",
        "source /etc/profile",  # environment.login_shell: PDC's scripts are `#!/bin/bash -l`
        "hpctrain_module load PDC",
        "hpctrain_module load singularity/4.2.0-cpeGNU-24.11",
        'export FI_PROVIDER="${FI_PROVIDER:-cxi}"',
        'export NCCL_SOCKET_IFNAME="hsn0"',
        'hpctrain_launch+=(singularity exec --rocm --bind "/cfs/klemming:/cfs/klemming" --bind '
        '"/scratch/runs/demo:/scratch/runs/demo" '
        '"/cfs/klemming/projects/supr/naiss2025-22-0000/pytorch-rocm-2.8.sif")'
        "  # environment.container (singularity)",
    ],
}


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    monkeypatch.setenv(jobenv.PYTHON, "/opt/hpctrain/bin/python")
    return tmp_path


def rendered(name: str) -> str:
    profile = resolve(str(EXAMPLES / f"{name}.yaml"), {})
    req = JobRequest.build(profile, name="demo", nodes=2, args=[])
    return render(JobSpec.build(profile, req, RUN))


def test_the_examples_cover_the_kinds_of_site_asked_for():
    assert {p.stem for p in EXAMPLES.glob("*.yaml")} == set(EXPECT)
    assert len(EXPECT) >= 14


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_example_renders_what_the_site_documents(name, tmp_path):
    header = (EXAMPLES / f"{name}.yaml").read_text().split("\nname:")[0]
    assert re.search(r"^#\s+https://\S+", header, re.M), (
        f"{name}: no source page cited in the header"
    )
    text = rendered(name)
    lines = {ln.strip() for ln in text.splitlines()}
    missing = [ln for ln in EXPECT[name] if ln not in lines]
    assert not missing, f"{name} lacks:\n" + "\n".join(missing)
    assert rendered(name) == text
    script = tmp_path / "job.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    exe = shutil.which("shellcheck")
    assert exe, "shellcheck is missing: `make sysdeps`"
    out = subprocess.run([exe, "--shell=bash", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_profiles_list_shows_every_example_as_example_name():
    rows = json.loads(cli("profiles", "list", "--json").output)
    examples = [r for r in rows if r["kind"] == "example"]
    assert {r["name"] for r in examples} == {f"example:{n}" for n in EXPECT}
    for r in examples:
        assert r["error"] is None and r["wins"], r
        assert r["scheduler"] == "slurm" and r["description"]
    assert rows[-len(examples) :] == examples  # a group of their own, after every usable profile
    table = cli("profiles", "list").output
    assert "example:juwels-booster" in table and "example:NAME: a real cluster" in table


def test_an_example_is_usable_by_name_and_never_takes_a_plain_name(isolated):
    assert resolve("example:juwels-booster").name == "juwels-booster"
    mine = write(
        Path(isolated) / "config" / "hpctrain" / "profiles" / "juwels-booster.yaml",
        "name: juwels-booster\nextends: example:juwels-booster\ndescription: mine\n"
        "slurm: {account: mine0001}\n",
    )
    profile = resolve("juwels-booster")
    assert profile.source == mine and profile.slurm.account == "mine0001"
    assert profile.slurm.partition == "booster"  # from the example it extends
    rows = json.loads(cli("profiles", "list", "--json").output)
    assert [(r["kind"], r["wins"]) for r in rows if r["name"].endswith("juwels-booster")] == [
        ("user", True),
        ("example", True),
    ]
    miss = cli("render", "--profile", "alvis", "--nodes", "2")
    assert miss.exit_code == 2 and "did you mean 'example:c3se-alvis'?" in miss.output
