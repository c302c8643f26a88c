"""hpctrain doctor on this machine (local profile, real torchrun + gloo sweep), a profile with a wrong
interface, and the node checks against crafted inputs (IB sysfs trees, ports, NCCL interface syntax)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.checks import doctor as d

HPCTRAIN = [sys.executable, "-m", "hpctrain"]


def hp(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "XDG_CONFIG_HOME": str(cwd / ".config"),
        "XDG_STATE_HOME": str(cwd / ".state"),
    }
    return subprocess.run(
        [*HPCTRAIN, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_local_doctor_passes_and_sweeps_every_size(tmp_path):
    out = hp(
        "doctor", "--profile", "local", "--gpus", "2", "--max-mib", "1", "--json", cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rep = json.loads(out.stdout)
    assert rep["ok"] is True
    checks = {c["name"]: c for c in rep["node_reports"][0]["checks"]}
    assert checks["interface"]["status"] == "pass" and "lo" in checks["interface"]["detail"]
    assert checks["port"]["status"] == "pass" and checks["shm"]["status"] == "pass"
    assert checks["resolve"]["status"] == "pass"
    sweep = rep["sweep"]
    assert sweep["backend"] == "gloo" and sweep["world"] == 2
    assert [r["bytes"] for r in sweep["rows"]] == [1024 << i for i in range(11)]  # 1 KiB .. 1 MiB
    for r in sweep["rows"]:
        assert r["count"] == r["bytes"] // 4 and r["correct"] is True
        assert r["time_us"] > 0 and r["algbw_gbps"] > 0
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (2 - 1) / 2)


def test_wrong_interface_is_diagnosed_by_name(tmp_path):
    prof = tmp_path / "badnet.yaml"
    prof.write_text(
        'name: badnet\nextends: local\nnetwork:\n  socket_ifname: "=nosuch0"\n'
        "  gloo_socket_ifname: nosuch0\n"
    )
    os.chmod(prof, 0o644)
    os.chmod(tmp_path, 0o755)
    out = hp("doctor", "--profile", str(prof), "--quick", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    text = out.stdout
    fail = next(ln for ln in text.splitlines() if ln.strip().startswith("FAIL interface"))
    assert "nosuch0" in fail and "no interface matches" in fail
    assert (
        "likely cause: wrong network interface" in text and "fix: set network.socket_ifname" in text
    )
    assert "not run: fix the failed checks above first" in text
    assert "1 check(s) failed: interface" in text


def test_unknown_profile_exits_2(tmp_path):
    out = hp("doctor", "--profile", "no-such-profile", cwd=tmp_path, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("eth", ["eth0", "eth10"]),  # prefix
        ("=eth0", ["eth0"]),  # exact
        ("^docker,lo", ["eth0", "eth10", "ib0"]),  # exclusion list
        ("ib0,lo", ["ib0", "lo"]),
        ("^=eth0", ["docker0", "eth10", "ib0", "lo"]),
        ("nosuch", []),
    ],
)
def test_nccl_interface_syntax(spec, expected):
    names = ["docker0", "eth0", "eth10", "ib0", "lo"]
    assert d.match_ifname(spec, names) == expected


def test_interfaces_lists_loopback_with_its_address():
    ifaces = d.interfaces()
    lo = ifaces["lo"]
    assert lo.loopback and any(a.startswith("127.0.0.1/") for a in lo.addrs)
    assert d._ioctl_ipv4("lo").startswith("127.0.0.1/")  # the fallback without iproute2


def test_interface_and_resolve_checks():
    ifaces = {"lo": d.Iface("lo", ["127.0.0.1/8"], True), "eth0": d.Iface("eth0", [], False)}
    c, matched = d.check_interface("lo", ifaces, "GLOO_SOCKET_IFNAME")
    assert c.status == "pass" and [i.name for i in matched] == ["lo"]
    c, _ = d.check_interface("eth", ifaces, "NCCL_SOCKET_IFNAME")
    assert c.status == "fail" and "none has an IPv4 address" in c.detail
    c, _ = d.check_interface("eth", ifaces, "GLOO_SOCKET_IFNAME")  # gloo: exact names only
    assert c.status == "fail" and "no interface matches" in c.detail
    assert d.check_resolve("localhost", "127.0.0.1", [ifaces["lo"]]).status == "pass"
    bad = d.check_resolve("localhost", "127.0.0.9", None)
    assert bad.status == "fail" and "127.0.0.9" in bad.detail
    assert d.check_resolve("no-such-host.invalid", None, None).status == "fail"
    # a 127.x address is on lo (the whole /8 is local); not on an interface without it
    assert d._in_iface("127.0.0.2", ifaces["lo"]) and not d._in_iface("127.0.0.2", ifaces["eth0"])


def test_port_checks():
    import socket

    lo, hi = d.ephemeral_range()
    assert d.check_port(29500, bind=False).status == "fail"
    eph = d.check_port(lo, bind=False)
    assert eph.status == "fail" and "ephemeral" in eph.detail
    with socket.socket() as s:
        for port in range(21000 + os.getpid() % 500, 22000):  # outside the default ephemeral range
            if lo <= port <= hi:
                continue
            try:
                s.bind(("", port))
                break
            except OSError:
                continue
        s.listen()
        held = d.check_port(port, bind=True)
        assert held.status == "fail" and "not free" in held.detail
    assert d.check_port(port, bind=True).status == "pass"


def _ib_tree(root: Path, ports: dict[str, str]) -> Path:
    for name, state in ports.items():
        dev, port = name.split(":")
        p = root / dev / "ports" / port
        p.mkdir(parents=True)
        (p / "state").write_text(state + "\n")
    return root


def test_infiniband_port_states(tmp_path):
    root = _ib_tree(tmp_path, {"mlx5_0:1": "4: ACTIVE", "mlx5_1:1": "1: DOWN"})
    assert d.check_ib(False, None, root).status == "skip"
    assert d.check_ib(True, None, root).status == "pass"
    down = d.check_ib(True, "mlx5_1:1", root)
    assert down.status == "fail" and "mlx5_1:1 1: DOWN" in down.detail and "ib_hca" in down.fix
    assert d.check_ib(True, "^mlx5_1", root).status == "pass"
    assert d.check_ib(True, None, tmp_path / "none").status == "fail"


def test_small_shm_fails_with_the_container_fix(monkeypatch):
    real = os.statvfs("/dev/shm")

    class Small:
        f_blocks, f_frsize = 64 * 1024**2 // real.f_frsize, real.f_frsize

    monkeypatch.setattr(d.os, "statvfs", lambda path: Small)
    c = d.check_shm()
    assert c.status == "fail" and "--shm-size" in c.fix


def test_gpu_check_is_skipped_for_cpu_workers_and_warns_without_a_driver(monkeypatch):
    assert d.check_gpus(0, False).status == "skip"
    monkeypatch.setenv("PATH", "/nonexistent")
    assert d.check_gpus(2, True).status == "warn"


def test_sweep_failures_name_the_cause():
    timeout = d.sweep_check({"error": "DistBackendError: ... timed out after 120000 ms"})
    assert timeout.failed and "P2P" in timeout.cause and "NCCL_P2P_DISABLE=1" in timeout.fix
    addr = d.sweep_check({"error": "RuntimeError: Unable to find address for: nosuch0"})
    assert addr.failed and "interface" in addr.cause
    wrong = d.sweep_check(
        {
            "backend": "gloo",
            "world": 2,
            "rows": [
                {
                    "bytes": 1024,
                    "count": 256,
                    "time_us": 1.0,
                    "algbw_gbps": 1.0,
                    "busbw_gbps": 1.0,
                    "correct": False,
                }
            ],
        }
    )
    assert wrong.failed


def test_sweep_sizes():
    assert d.sweep_sizes(256 << 20)[0] == 1024 and d.sweep_sizes(256 << 20)[-1] == 256 << 20
    assert len(d.sweep_sizes(16 << 20)) == 15
