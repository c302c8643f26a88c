"""Site profiles executed on the live loopback Slurm cluster, not only rendered.

- `launch.launcher: srun` (one srun task per GPU, env:// init, no torchrun agent) trains train_entry
  on 2 nodes x 2 tasks, with the rendezvous head reached by its suffixed name (`n1i`, from the
  nodes' /etc/hosts, as JSC's `<host>i` names); a preempt + requeue ends bit-identical to an
  uninterrupted run of the same profile.
- Every container kind (pyxis, apptainer, singularity, Shifter, EDF) and a site's torchrun wrapper,
  through stand-ins at the process boundary (tests/standins/: record argv, exec the inner command),
  so the real training runs inside them; the records show what a real site's programs would get.

    sudo .venv/bin/python -m pytest -m slurm tests/test_sites_live.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _events import kinds
from _hold import held

from tests.test_slurm_e2e import ENDED, FULL, FULL_STEPS, Runs, lines, steps

pytestmark = [pytest.mark.slurm]

REPO = Path(__file__).resolve().parent.parent
STANDINS = REPO / "tests" / "standins"
SMALL = [
    "--train.micro_batch=4",
    "--train.global_batch=4",
    "--train.log_every=1",
    "--max-steps=2",
    "--model.d_model=32",
    "--model.n_layers=1",
    "--model.seq_len=16",
    "--checkpoint-every=2",
]


class Site(Runs):
    """A test folder with its own profiles, the stand-ins first on PATH and a record folder."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.record = root / "record"
        self.record.mkdir()
        (root / "profiles").mkdir()
        self.env.update(
            PATH=f"{STANDINS}:{os.environ['PATH']}",
            STANDIN_RECORD=str(self.record),
            STANDIN_DATA=str(root / "data"),
        )

    def profile(self, name: str, text: str) -> str:
        path = self.root / "profiles" / f"{name}.yaml"
        path.write_text(f"name: {name}\nextends: loopback\n{text}")
        path.chmod(0o644)
        return str(path)

    def submit_with(
        self, profile: str, name: str, *, nodes: int, gpus: int, train: list[str]
    ) -> str:
        out = self.hp(
            "submit",
            "--profile",
            profile,
            "--nodes",
            str(nodes),
            "--gpus",
            str(gpus),
            "--name",
            name,
            "--",
            *train,
        )
        m = re.search(r"job (\d+)", out.stdout)
        assert m, out.stdout
        return m.group(1)

    def records(self, tool: str) -> list[dict]:
        return lines(self.record / f"{tool}.jsonl")


@pytest.fixture
def site(slurm_cluster, tmp_path, request):
    s = Site(tmp_path)
    yield s
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        s.dump()
        for f in sorted(s.record.glob("*.jsonl")):
            print(f"==> {f} <==\n{f.read_text()[-4000:]}")
    for jobs in (tmp_path / "runs").glob("*/jobs.jsonl"):
        for job in lines(jobs):
            subprocess.run(["scancel", str(job["job_id"])], capture_output=True, timeout=30)


SRUN_PROFILE = f"""
launch:
  launcher: srun
  task_gpus: gpus-per-task
  python: {sys.executable}
rendezvous:
  host_suffix: i
"""


@pytest.mark.timeout(480)
def test_srun_launcher_trains_2x2_and_a_preempted_run_resumes_bit_identical(site):
    profile = site.profile("loopback-srun", SRUN_PROFILE)
    site.submit_with(profile, "ref", nodes=2, gpus=2, train=FULL)
    job = site.submit_with(profile, "pre", nodes=2, gpus=2, train=FULL)  # queued behind ref
    ref, pre = site.run("ref"), site.run("pre")
    info = site.wait("ref", ENDED, 300)
    assert info["state"] == "COMPLETED", info

    # one srun task per GPU: 4 processes, ranks from SLURM_PROCID, the head by its `i` name
    text = (ref / "job.sh").read_text()
    assert "#SBATCH --ntasks-per-node=2" in text and "--gpus-per-task=1" in text
    assert "hpctrain_head=${hpctrain_head}i " in text
    logs = "".join(p.read_text() for p in sorted((ref / "logs").glob("node-*.log")))
    for rank in range(4):
        assert re.search(
            rf"node {rank // 2} task {rank} \(local {rank % 2}\) on n{rank // 2 + 1} "
            r".* master=127\.0\.0\.2:\d+",
            logs,
        ), logs[-3000:]
    assert "hpctrain.launchers.rdzv" not in logs and "4 ranks" in (ref / "train.log").read_text()
    assert steps(ref) == list(range(1, FULL_STEPS + 1))

    # the preemption chain under srun: trap -> STOP -> all ranks save, exit 75 -> requeue -> resume
    site.until("pre training past step 3", lambda: len(steps(pre)) >= 3, 240)
    with held(pre):  # the preempt lands mid-run however slow it is under load
        assert f"job {job}" in site.hp("preempt", "pre").stdout
    site.until(
        "the requeued job starts",
        lambda: any(x["restart_count"] == 1 for x in lines(pre / "restarts.jsonl")),
        120,
    )
    info = site.wait("pre", ENDED, 300)
    assert info["state"] == "COMPLETED", info
    names = kinds(lines(pre / "events.jsonl"))
    assert names[:3] == ["signal", "preempted", "requeue"] and names[-1] == "done", names
    starts = re.findall(rf"step (\d+)/{FULL_STEPS}\n", (pre / "train.log").read_text())
    assert len(starts) >= 2 and starts[0] == "0" and int(starts[1]) > 0, starts
    assert (pre / "final_params.sha256").read_text() == (ref / "final_params.sha256").read_text()


# kind -> (environment.container, more launch keys, slurm keys)
CONTAINERS = {
    "pyxis": (
        """
    kind: pyxis
    image: nvcr.io#nvidia/pytorch:24.05-py3
    mounts: [$STANDIN_DATA:/data, /tmp]
    workdir: /tmp
    env: [NCCL_DEBUG]
    flags: [--container-writable]
""",
        "",
        "  single_node_sbatch: [--comment=single-node-only]\n",
    ),
    "apptainer": (
        """
    kind: apptainer
    image: $STANDIN_DATA/pytorch.sif
    mounts: [/tmp]
""",
        "  torchrun: torchrun-site\n  torchrun_args: [--local-addr=$HOSTNAME]\n",
        "",
    ),
    "singularity": (
        """
    kind: singularity
    image: docker://rocm/pytorch:latest
    exec: run
    mounts: [$STANDIN_DATA:/data:ro]
""",
        "",
        "  gpu_vendor: amd\n",
    ),
    "shifter": (
        """
    kind: shifter
    image: docker:nersc/pytorch:24.06.01
    modules: [gpu, nccl-plugin]
    mounts: [$STANDIN_DATA:/data]
""",
        "",
        "",
    ),
    "edf": (
        """
    kind: edf
    image: $STANDIN_DATA/pytorch.toml
""",
        "",
        "",
    ),
}


@pytest.mark.timeout(360)
def test_every_container_kind_and_a_torchrun_wrapper_run_real_training(site):
    (site.root / "data").mkdir()
    for kind, (container, launch, slurm) in CONTAINERS.items():
        text = (
            f"launch:\n  python: {sys.executable}\n{launch}environment:\n  container:{container}"
            + (f"slurm:\n{slurm}" if slurm else "")
        )
        site.submit_with(site.profile(f"loopback-{kind}", text), kind, nodes=1, gpus=1, train=SMALL)
    data, runs = str(site.root / "data"), {k: site.run(k) for k in CONTAINERS}
    deadline = time.monotonic() + 300
    for kind in CONTAINERS:
        info = site.wait(kind, ENDED, max(10.0, deadline - time.monotonic()))
        assert info["state"] == "COMPLETED", (kind, info)
        assert (runs[kind] / "final_params.sha256").is_file(), kind

    srun = [r["argv"] for r in site.records("srun")]
    pyxis = [a for a in srun if any(x.startswith("--container-image=") for x in a)]
    assert len(pyxis) == 1, srun
    run_dir = str(runs["pyxis"])
    assert (
        {
            "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
            "--container-workdir=/tmp",
            f"--container-mounts={data}:/data,/tmp:/tmp,{run_dir}:{run_dir}",  # $VAR expanded on the node
            "--container-env=NCCL_DEBUG",
            "--container-writable",
        }
        <= set(pyxis[0])
    )
    assert "#SBATCH --comment=single-node-only" in (runs["pyxis"] / "job.sh").read_text()
    edf = [a for a in srun if any(x.startswith("--environment=") for x in a)]
    assert len(edf) == 1 and f"--environment={data}/pytorch.toml" in edf[0], srun

    (app,) = [r["argv"] for r in site.records("apptainer")]
    run_dir = str(runs["apptainer"])
    assert app[:6] == ["exec", "--nv", "--bind", "/tmp:/tmp", "--bind", f"{run_dir}:{run_dir}"], app
    assert app[6] == f"{data}/pytorch.sif" and app[7:9] == ["bash", "-c"], app
    (wrapper,) = [r["argv"] for r in site.records("torchrun-site")]
    # the site's own torchrun finds hpctrain's signed rendezvous through the entry point
    assert "--nnodes=1" in wrapper and "--rdzv-backend=hpctrain" in wrapper, wrapper
    assert "--local-addr=n1" in wrapper or "--local-addr=n2" in wrapper, (
        wrapper
    )  # $HOSTNAME, on the node
    assert wrapper[-2:] == ["--strategy", "ddp"] or "train_entry" in wrapper, wrapper

    (sing,) = [r["argv"] for r in site.records("singularity")]
    run_dir = str(runs["singularity"])
    assert sing[:6] == [
        "run",
        "--rocm",
        "--bind",
        f"{data}:/data:ro",
        "--bind",
        f"{run_dir}:{run_dir}",
    ]
    assert sing[6] == "docker://rocm/pytorch:latest", sing

    text = (runs["shifter"] / "job.sh").read_text()
    assert (
        "#SBATCH --image=docker:nersc/pytorch:24.06.01\n#SBATCH --module=gpu,nccl-plugin\n" in text
    )
    (shifter,) = [r["argv"] for r in site.records("shifter")]
    run_dir = str(runs["shifter"])
    assert shifter[:2] == [f"--volume={data}:/data", f"--volume={run_dir}:{run_dir}"], shifter
    assert shifter[2:4] == ["bash", "-c"], shifter
    for kind in CONTAINERS:  # inside each, the real training ran to its end
        assert "done: 2 steps" in (runs[kind] / "train.log").read_text(), kind
