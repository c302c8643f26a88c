"""This node's network interfaces (name, IPv4, up, loopback) and NCCL's interface-name syntax."""

from __future__ import annotations

import fcntl
import ipaddress
import os
import shutil
import socket
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

# --- interfaces -------------------------------------------------------------------------------


@dataclass
class Iface:
    name: str
    addrs: list[str]  # "a.b.c.d/prefix" or "x::y/prefix"
    loopback: bool


def interfaces() -> dict[str, Iface]:
    """Interfaces and their addresses: `ip -o addr` when iproute2 is there, else /sys/class/net and
    the SIOCGIFADDR/SIOCGIFNETMASK ioctls (IPv4)."""
    out: dict[str, Iface] = {}
    names = (
        sorted(os.listdir("/sys/class/net"))
        if os.path.isdir("/sys/class/net")
        else [n for _, n in socket.if_nameindex()]
    )
    for name in names:
        out[name] = Iface(name, [], _is_loopback(name))
    ip = shutil.which("ip")
    if ip:
        try:
            text = subprocess.run(
                [ip, "-o", "addr", "show"], capture_output=True, text=True, timeout=10
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            text = ""
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] in ("inet", "inet6"):
                name = parts[1].split("@")[0]
                out.setdefault(name, Iface(name, [], _is_loopback(name))).addrs.append(parts[3])
        if text:
            return out
    for name, iface in out.items():
        addr = _ioctl_ipv4(name)
        if addr:
            iface.addrs.append(addr)
    return out


def _is_loopback(name: str) -> bool:
    try:
        return bool(int(Path(f"/sys/class/net/{name}/flags").read_text(), 16) & 0x8)  # IFF_LOOPBACK
    except (OSError, ValueError):
        return name == "lo"


def _ioctl_ipv4(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("256s", name.encode()[:15])
        try:
            addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24])  # SIOCGIFADDR
            mask = socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x891B, req)[20:24])  # SIOCGIFNETMASK
        except OSError:
            return None
    return f"{addr}/{ipaddress.IPv4Network(f'0.0.0.0/{mask}').prefixlen}"


def parse_ifname(spec: str) -> tuple[bool, bool, list[str]]:
    """NCCL_SOCKET_IFNAME syntax: (exclude, exact, names). "^" excludes, "=" matches exactly,
    otherwise each name is a prefix; names are comma-separated ("^docker,lo", "=eth0", "ib0,ib1")."""
    s = spec.strip()
    exclude = s.startswith("^")
    s = s[1:] if exclude else s
    exact = s.startswith("=")
    s = s[1:] if exact else s
    return exclude, exact, [n.strip() for n in s.split(",") if n.strip()]


def match_ifname(spec: str, names: list[str]) -> list[str]:
    """The interfaces NCCL/gloo would consider for `spec`, in order."""
    exclude, exact, wanted = parse_ifname(spec)

    def hit(name: str) -> bool:
        return any(name == w if exact else name.startswith(w) for w in wanted)

    return [n for n in names if hit(n) != exclude]


def _in_iface(addr: str, iface: Iface) -> bool:
    """`addr` is one of the interface's addresses; on a loopback interface, anywhere in its network
    (every 127.x address is local)."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    for a in iface.addrs:
        net = ipaddress.ip_interface(a)
        if net.ip == ip or (iface.loopback and ip in net.network):
            return True
    return False
