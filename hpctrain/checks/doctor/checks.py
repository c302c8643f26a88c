"""The node checks of `hpctrain doctor` and the preflight gate (no torch): interface, name
resolution, port, InfiniBand, GPUs, scontrol, shared memory."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypedDict

from hpctrain.checks.doctor.net import Iface, _in_iface, interfaces, match_ifname, parse_ifname

# Docker's default /dev/shm is 64 MiB; NCCL's shared-memory transport needs more
MIN_SHM_BYTES = 512 * 1024**2
SLEEP_PORT = 29500  # the port every tutorial uses: a collision magnet


class CheckJson(TypedDict):
    name: str
    status: str
    detail: str
    cause: str
    fix: str


@dataclass
class Check:
    name: str
    status: str  # pass | fail | warn | skip
    detail: str
    cause: str = ""
    fix: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "fail"


class NodeReportJson(TypedDict):
    """A node's report as the worker writes it (node-<n>.json: NodeReport.to_dict)."""

    node: str
    host: str
    checks: list[CheckJson]


@dataclass
class NodeReport:
    node: str  # node index in the job
    host: str
    checks: list[Check] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {"node": self.node, "host": self.host, "checks": [asdict(c) for c in self.checks]}

    @classmethod
    def from_dict(cls, d: NodeReportJson) -> NodeReport:
        return cls(str(d["node"]), d["host"], [Check(**c) for c in d["checks"]])


# --- checks -------------------------------------------------------------------------------------

WRONG_IFACE = (
    "wrong network interface: NCCL/gloo bind to an interface that does not exist here or "
    "cannot reach the other nodes (multi-node jobs then time out)"
)


def check_interface(
    spec: str | None, ifaces: dict[str, Iface], var: str
) -> tuple[Check, list[Iface]]:
    name = "interface" if var == "GLOO_SOCKET_IFNAME" else "interface (nccl)"
    if not spec:
        return Check(
            name,
            "warn",
            f"{var} is not set: the library picks an interface itself "
            "(gloo: the one the hostname resolves to; NCCL: may choose docker0)",
            "no interface pinned",
            'set network.socket_ifname in the profile (e.g. "^docker,lo" or "=eth0")',
        ), []
    # gloo takes exact names only; NCCL has ^ (exclude), = (exact) and prefixes
    names = match_ifname("=" + spec if var.startswith("GLOO") else spec, list(ifaces))
    matched = [ifaces[n] for n in names]
    with_addr = [i for i in matched if any(":" not in a for a in i.addrs)]
    have = ", ".join(f"{i.name}({','.join(i.addrs) or 'no address'})" for i in ifaces.values())
    if not matched:
        return Check(
            name,
            "fail",
            f"{var}={spec}: no interface matches on this node (have: {have})",
            WRONG_IFACE,
            f"set network.socket_ifname (and gloo_socket_ifname) in the profile "
            f'to an interface of this node, e.g. "={next(iter(ifaces), "eth0")}"; NCCL syntax: '
            '"^" excludes, "=" is exact, otherwise a prefix',
        ), []
    if not with_addr:
        return Check(
            name,
            "fail",
            f"{var}={spec} matches {', '.join(i.name for i in matched)} but none "
            f"has an IPv4 address (have: {have})",
            WRONG_IFACE,
            "bring the interface up with an address, or name another interface in the profile",
        ), []
    return Check(
        name,
        "pass",
        f"{var}={spec}: "
        + ", ".join(f"{i.name} {','.join(a for a in i.addrs if ':' not in a)}" for i in with_addr),
    ), with_addr


def check_resolve(host: str, expected: str | None, local: list[Iface] | None) -> Check:
    """The rendezvous host resolves here, to the address the head publishes (`expected`), and, on
    the head node itself, that address is on the profile's interface (`local`)."""
    try:
        addrs = sorted({str(ai[4][0]) for ai in socket.getaddrinfo(host, None, socket.AF_INET)})
    except OSError as e:
        return Check(
            "resolve",
            "fail",
            f"rendezvous host {host!r} does not resolve here: {e}",
            "the head's hostname is unknown on this node (c10d publishes hostnames)",
            "add the nodes to DNS or /etc/hosts on every node, or set the interface so that "
            "the head's address is used",
        )
    if expected and expected not in addrs:
        return Check(
            "resolve",
            "fail",
            f"{host} resolves to {', '.join(addrs)} here, but the rendezvous uses {expected}",
            "nodes disagree on the head's address (e.g. 127.0.1.1 from /etc/hosts)",
            "fix /etc/hosts or DNS so every node resolves the head to the same routable address",
        )
    addr = expected or addrs[0]
    if local is not None:
        if not any(_in_iface(addr, i) for i in local):
            return Check(
                "resolve",
                "fail",
                f"{host} -> {addr}, which is not an address of the "
                f"profile's interface ({', '.join(i.name for i in local) or 'none'}) on the head",
                WRONG_IFACE,
                "name the interface that carries the head's address in "
                "network.socket_ifname, or fix the hostname's resolution",
            )
    return Check(
        "resolve",
        "pass",
        f"{host} -> {', '.join(addrs)}" + (" (on the profile's interface)" if local else ""),
    )


def ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999  # Linux default


def check_port(port: int, *, bind: bool) -> Check:
    lo, hi = ephemeral_range()
    if port == SLEEP_PORT:
        return Check(
            "port",
            "fail",
            f"port {port} is the tutorials' default",
            "another job on the node may hold it",
            "set rendezvous.port_min/port_max in the profile",
        )
    if lo <= port <= hi:
        return Check(
            "port",
            "fail",
            f"port {port} is inside the ephemeral range {lo}-{hi}",
            "outgoing connections take ephemeral ports: the rendezvous collides intermittently",
            f"set rendezvous.port_min/port_max outside {lo}-{hi}",
        )
    if bind:
        try:
            with socket.socket() as s:
                s.bind(("", port))
        except OSError as e:
            return Check(
                "port",
                "fail",
                f"port {port} is not free: {e}",
                "another process holds it",
                "pick another range in rendezvous.port_min/port_max",
            )
    return Check(
        "port", "pass", f"{port} {'free and ' if bind else ''}outside the ephemeral range {lo}-{hi}"
    )


def _hca_match(spec: str | None, dev: str, port: str) -> bool:
    if not spec:
        return True
    exclude, exact, wanted = parse_ifname(spec)
    hit = False
    for w in wanted:
        name, _, p = w.partition(":")
        if (dev == name if exact else dev.startswith(name)) and (not p or p == port):
            hit = True
    return hit != exclude


def check_ib(enabled: bool, hca: str | None, root: Path = Path("/sys/class/infiniband")) -> Check:
    if not enabled:
        return Check("infiniband", "skip", "InfiniBand is off in the profile (NCCL_IB_DISABLE=1)")
    ports = []
    for state in sorted(root.glob("*/ports/*/state")):
        dev, port = state.parts[-4], state.parts[-2]
        if _hca_match(hca, dev, port):
            ports.append((dev, port, state.read_text().strip()))
    active = [f"{d}:{p}" for d, p, s in ports if "ACTIVE" in s]
    if active:
        return Check("infiniband", "pass", "active: " + ", ".join(active))
    seen = ", ".join(f"{d}:{p} {s}" for d, p, s in ports) or f"no devices in {root}"
    return Check(
        "infiniband",
        "fail",
        f"no ACTIVE InfiniBand port{' for NCCL_IB_HCA=' + hca if hca else ''} ({seen})",
        "NCCL falls back to sockets silently, or the HCA list names the wrong device",
        'fix network.ib_hca (NCCL syntax, e.g. "mlx5_0:1"), or set network.ib: false',
    )


def check_gpus(expected: int, want: bool) -> Check:
    if not want or expected == 0:
        return Check(
            "gpus", "skip", "CPU workers (the profile requests no GPUs): nvidia-smi not needed"
        )
    smi = shutil.which("nvidia-smi")
    if not smi:
        return Check(
            "gpus",
            "warn",
            f"the profile asks for {expected} GPU(s) per node but nvidia-smi is not "
            "here: this node runs the workers on CPU (gloo)",
            "no NVIDIA driver on this node",
            "run on GPU nodes (partition/constraint), or load the driver module",
        )
    try:
        out = subprocess.run(
            [
                smi,
                "--query-gpu=index,name,driver_version,memory.total",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return Check(
            "gpus", "fail", f"nvidia-smi failed: {e}", "driver hang or missing", "check the node"
        )
    rows = [r.split(", ") for r in out.stdout.strip().splitlines() if r.strip()]
    if out.returncode != 0 or len(rows) < expected:
        return Check(
            "gpus",
            "fail",
            f"{len(rows)} GPU(s) visible, {expected} requested "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): "
            f"{out.stderr.strip()[:200]}",
            "GPUs not allocated or a driver problem",
            "check slurm.gpu_request (gpus-per-node or gres) and the node's driver",
        )
    return Check(
        "gpus",
        "pass",
        f"{len(rows)} GPU(s), driver {rows[0][2]}: "
        + "; ".join(f"{r[0]} {r[1]} {r[3]} MiB" for r in rows),
    )


def check_scontrol(slurm: bool) -> Check:
    if not slurm:
        return Check("scontrol", "skip", "local profile: no Slurm")
    exe = shutil.which("scontrol")
    if not exe:
        return Check(
            "scontrol",
            "warn",
            "scontrol is not on PATH in the job's task (inside a container?); "
            "requeue runs from the batch shell, which resolved the nodes with scontrol before "
            "this task started",
            "Slurm client missing in the task's environment",
            "nothing to do unless the batch shell lacks it too (the job would fail at start)",
        )
    jid = os.environ.get("SLURM_JOB_ID", "")
    out = subprocess.run(
        [exe, "show", "job", jid] if jid else [exe, "ping"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if out.returncode != 0:
        return Check(
            "scontrol",
            "fail",
            f"scontrol cannot reach the controller: {out.stderr.strip()[:200]}",
            "the controller is unreachable from the nodes",
            "check slurmctld and munge",
        )
    return Check("scontrol", "pass", f"{exe} reaches the controller")


def check_shm(path: str = "/dev/shm") -> Check:
    try:
        st = os.statvfs(path)
    except OSError as e:
        return Check("shm", "fail", f"{path}: {e}", "no shared memory", "mount /dev/shm")
    size = st.f_blocks * st.f_frsize
    detail = f"{path} {size / 1024**3:.1f} GiB"
    if size < MIN_SHM_BYTES:
        return Check(
            "shm",
            "fail",
            detail + f" (< {MIN_SHM_BYTES // 1024**2} MiB)",
            "small shared memory in a container: NCCL's SHM transport and DataLoader workers "
            "fail with bus errors",
            "run the container with --shm-size=16g or --ipc=host "
            "(pyxis/apptainer share the host's /dev/shm)",
        )
    return Check("shm", "pass", detail)


def node_checks(
    *,
    env: dict[str, str],
    head: str | None,
    rdzv_addr: str | None,
    port: int | None,
    is_head: bool,
    expect_gpus: int,
    want_gpu: bool,
    slurm: bool,
    bind_port: bool,
    uses_nccl: bool = False,
) -> list[Check]:
    """Every node-level check, reading the network settings from the job's environment (what the
    rendered script exported), so the script users get is what is checked."""
    ifaces = interfaces()
    checks = []
    gloo, gloo_ifs = check_interface(env.get("GLOO_SOCKET_IFNAME"), ifaces, "GLOO_SOCKET_IFNAME")
    checks.append(gloo)
    nccl_ifs = gloo_ifs
    if env.get("NCCL_SOCKET_IFNAME"):  # NCCL also bootstraps over it when it runs (GPU nodes)
        nccl, nccl_ifs = check_interface(env["NCCL_SOCKET_IFNAME"], ifaces, "NCCL_SOCKET_IFNAME")
        if not uses_nccl and nccl.failed:
            nccl.status, nccl.detail = "warn", nccl.detail + " (not used: CPU workers run gloo)"
        checks.append(nccl)
    if head:
        checks.append(check_resolve(head, rdzv_addr, nccl_ifs if is_head and nccl_ifs else None))
    if port is not None:
        checks.append(check_port(port, bind=bind_port))
    checks.append(check_ib(env.get("NCCL_IB_DISABLE", "1") == "0", env.get("NCCL_IB_HCA")))
    checks.append(check_gpus(expect_gpus, want_gpu))
    checks.append(check_scontrol(slurm))
    checks.append(check_shm())
    return checks
