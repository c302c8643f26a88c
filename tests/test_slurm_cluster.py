"""The loopback Slurm cluster itself (tests/slurm/cluster.sh): the facts the end-to-end tests rely
on. Raw sbatch scripts only; the hpctrain CLI is tested end to end in test_slurm_e2e.py."""

from __future__ import annotations

import subprocess
import time

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]


def test_two_nodes_each_with_own_hostname_resolving_on_loopback(slurm_cluster, tmp_path):
    job = slurm_cluster.sbatch(
        "#!/bin/bash\n"
        "srun bash -c 'echo \"$(hostname) $SLURM_NODEID "
        '$(getent hosts n1 n2 | tr -s " \\n" " ")"\'\n',
        tmp_path,
        "--nodes=2",
        "--ntasks-per-node=1",
        "--time=2",
        "--output=out.txt",
    )
    assert slurm_cluster.wait_done(job) == "COMPLETED"
    lines = sorted(line.strip() for line in (tmp_path / "out.txt").read_text().splitlines())
    # Each node also answers to its suffixed name (n1i, n2i) for rendezvous.host_suffix profiles.
    assert lines == [
        "n1 0 127.0.0.2 n1 n1i 127.0.0.3 n2 n2i",
        "n2 1 127.0.0.2 n1 n1i 127.0.0.3 n2 n2i",
    ]


@pytest.mark.parametrize("gpus, visible", [(2, "0,1"), (1, "0")])
def test_fake_gpus_set_cuda_visible_devices(slurm_cluster, tmp_path, gpus, visible):
    job = slurm_cluster.sbatch(
        "#!/bin/bash\nsrun bash -c 'echo \"$(hostname) $CUDA_VISIBLE_DEVICES\"'\n",
        tmp_path,
        "--nodes=2",
        f"--gpus-per-node={gpus}",
        "--time=2",
        "--output=out.txt",
    )
    assert slurm_cluster.wait_done(job) == "COMPLETED"
    assert sorted((tmp_path / "out.txt").read_text().splitlines()) == [
        f"n1 {visible}",
        f"n2 {visible}",
    ]
    (row,) = slurm_cluster.sacct(job)
    assert f"gres/gpu={2 * gpus}" in row["AllocTRES"]


def test_more_gpus_than_a_node_has_is_rejected(slurm_cluster, tmp_path):
    (tmp_path / "j.sh").write_text("#!/bin/bash\ntrue\n")
    out = subprocess.run(
        ["sbatch", "--gpus-per-node=3", "--time=1", str(tmp_path / "j.sh")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0
    assert "Requested node configuration is not available" in out.stderr


def test_sacct_is_real_accounting(slurm_cluster, tmp_path):
    ok = slurm_cluster.sbatch("#!/bin/bash\ntrue\n", tmp_path, "--time=1", "--output=/dev/null")
    bad = slurm_cluster.sbatch("#!/bin/bash\nexit 3\n", tmp_path, "--time=1", "--output=/dev/null")
    slurm_cluster.wait_done(ok)
    slurm_cluster.wait_done(bad)
    (row_ok,) = slurm_cluster.sacct(ok)
    (row_bad,) = slurm_cluster.sacct(bad)
    assert (row_ok["State"], row_ok["ExitCode"]) == ("COMPLETED", "0:0")
    assert (row_bad["State"], row_bad["ExitCode"]) == ("FAILED", "3:0")


def test_scancel_batch_signal_reaches_the_batch_shell_trap(slurm_cluster, tmp_path):
    # The preemption chain's first link: `hpctrain preempt` sends exactly this.
    job = slurm_cluster.sbatch(
        "#!/bin/bash\n"
        "trap 'echo got-usr2 > trap.txt; exit 0' USR2\n"
        "touch started.txt\n"
        "for i in $(seq 600); do sleep 0.2 & wait $!; done\n"
        "echo no-signal > trap.txt\n",
        tmp_path,
        "--time=2",
        "--output=out.txt",
    )
    _wait_file(tmp_path / "started.txt", 60)
    out = subprocess.run(
        ["scancel", "--batch", "--signal=USR2", job], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert slurm_cluster.wait_done(job) == "COMPLETED"
    assert (tmp_path / "trap.txt").read_text() == "got-usr2\n"


def test_scontrol_requeue_reruns_with_restart_count(slurm_cluster, tmp_path):
    job = slurm_cluster.sbatch(
        "#!/bin/bash\n"
        'echo "start ${SLURM_RESTART_COUNT:-unset} $(hostname)" >> starts.txt\n'
        'if [ -z "$SLURM_RESTART_COUNT" ]; then for i in $(seq 600); do sleep 0.2; done; fi\n',
        tmp_path,
        "--time=3",
        "--output=out.txt",
        "--open-mode=append",
        "--requeue",
    )
    _wait_file(tmp_path / "starts.txt", 60)
    out = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    # cred_expire=5 on this cluster: the rerun starts about 6 s later.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and len(_lines(tmp_path / "starts.txt")) < 2:
        time.sleep(0.5)
    assert [line.split()[:2] for line in _lines(tmp_path / "starts.txt")] == [
        ["start", "unset"],
        ["start", "1"],
    ]
    assert slurm_cluster.wait_done(job) == "COMPLETED"
    states = [r["State"] for r in slurm_cluster.sacct(job)]
    assert states[-1] == "COMPLETED" and "REQUEUED" in states, states


def _lines(path):
    return path.read_text().splitlines() if path.exists() else []


def _wait_file(path, timeout):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} not created within {timeout} s"
        time.sleep(0.2)
