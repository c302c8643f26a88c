"""hpctrain doctor on the live two-node loopback cluster: a real job through the rendered script
(entry `python -m hpctrain.checks.doctor.worker`), node checks on n1 and n2, a 4-rank gloo sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm]


def hp(*args: str, cwd: Path, timeout: float = 280) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "XDG_CONFIG_HOME": str(cwd / ".config"),
        "XDG_STATE_HOME": str(cwd / ".state"),
    }
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.timeout(300)
def test_doctor_job_on_two_nodes_passes(slurm_cluster, tmp_path):
    out = hp(
        "doctor",
        "--profile",
        "loopback",
        "--nodes",
        "2",
        "--max-mib",
        "1",
        "--wait-s",
        "240",
        "--json",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rep = json.loads(out.stdout)
    assert rep["ok"] and rep["job_id"] and rep["scheduler"] == "slurm"
    run = Path(rep["run_dir"])
    assert (run / "job.sh").read_text().count(
        "hpctrain.checks.doctor.worker"
    ) == 1  # the normal script
    hosts = sorted(r["host"] for r in rep["node_reports"])
    assert hosts == list(slurm_cluster.nodes)
    for r in rep["node_reports"]:
        checks = {c["name"]: c for c in r["checks"]}
        assert checks["interface"]["status"] == "pass"
        assert checks["resolve"]["status"] == "pass" and "127.0.0.2" in checks["resolve"]["detail"]
        assert checks["port"]["status"] == "pass" and checks["scontrol"]["status"] == "pass"
        assert checks["gpus"]["status"] == "warn"  # fake gres GPUs, no driver: CPU workers
    sweep = rep["sweep"]
    assert sweep["world"] == 4 and sweep["backend"] == "gloo"
    assert [r["bytes"] for r in sweep["rows"]] == [1024 << i for i in range(11)]
    assert all(r["correct"] and r["busbw_gbps"] > 0 for r in sweep["rows"])


@pytest.mark.timeout(300)
def test_doctor_names_a_wrong_interface_on_every_node(slurm_cluster, tmp_path):
    bad = tmp_path / "badnet.yaml"
    bad.write_text(
        "name: badnet\nextends: loopback\nnetwork:\n  socket_ifname: nosuch0\n"
        "  gloo_socket_ifname: nosuch0\n"
    )
    os.chmod(bad, 0o644)
    os.chmod(tmp_path, 0o755)
    out = hp(
        "doctor",
        "--profile",
        str(bad),
        "--nodes",
        "2",
        "--gpus",
        "1",
        "--quick",
        "--wait-s",
        "240",
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    lines = [ln.strip() for ln in out.stdout.splitlines()]
    fails = [ln for ln in lines if ln.startswith("FAIL interface")]
    # Whichever node fails first makes srun stop the other (--kill-on-bad-exit), maybe before its
    # own check: at least one node names the interface, and none is left unexplained.
    assert fails and all("nosuch0" in ln for ln in fails), out.stdout
    stopped = [ln for ln in lines if ln.startswith("SKIP node") and "another node failed" in ln]
    assert len(fails) + len(stopped) == 2, out.stdout
    assert "likely cause: wrong network interface" in out.stdout
    assert not any(ln.startswith("FAIL node") for ln in lines), out.stdout
