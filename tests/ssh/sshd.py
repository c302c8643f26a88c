"""A real OpenSSH server on 127.0.0.1, in front of the live loopback Slurm cluster: the "site".

    python tests/ssh/sshd.py up DIR      # start; prints the port, writes DIR/site.json
    python tests/ssh/sshd.py down DIR    # stop exactly the sshd we started (its pid file)

Everything lives in DIR: a generated host key, a user key (no passphrase: the tests are BatchMode),
authorized_keys, a known_hosts entry for `[127.0.0.1]:PORT` (strict host key checking stays on), the
sshd config and its log (LogLevel VERBOSE: one "Connection from" line per new TCP connection, which
the benchmark counts). The server listens on loopback only. It runs as the user that starts it
(root in CI, so the "remote" login is root, as the test cluster's jobs are). Each SSH session gets
the site's own environment from `SetEnv` (SCRATCH, XDG_STATE_HOME, and XDG_RUNTIME_DIR, so the
login-node agents this site's sessions start keep their sockets in DIR/run, or in a short folder
in /tmp when DIR is too deep for a socket path; `down` stops them and removes that folder).
Streamlocal forwarding is sshd's default (allowed); `config=` adds lines, e.g.
`AllowStreamLocalForwarding no` for a site that refuses the agent's forward.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


@dataclass
class Site:
    dir: str  # the harness's own folder
    port: int
    user: str
    identity: str  # the user's private key (laptop side)
    known_hosts: str  # laptop side: holds only this server's host key
    scratch: str  # $SCRATCH on the site (not set on the laptop)
    state: str  # $XDG_STATE_HOME on the site: the site's run index
    log: str

    @property
    def host(self) -> str:
        return f"{self.user}@127.0.0.1"

    def connections(self) -> int:
        """New TCP connections the server accepted so far."""
        try:
            text = Path(self.log).read_text(errors="replace")
        except OSError:
            return 0
        return text.count("Connection from 127.0.0.1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path, kind: str = "ed25519") -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "hpctrain-test", "-f", str(path)],
        check=True,
        capture_output=True,
    )


def up(
    folder: Path, *, env: dict[str, str] | None = None, config: str = "", timeout: float = 20.0
) -> Site:
    """Start sshd in `folder` (created); returns the site's description."""
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
    for name in ("host_key", "user_key"):
        if not (folder / name).exists():
            _keygen(folder / name)
    (folder / "authorized_keys").write_text((folder / "user_key.pub").read_text())
    scratch, state = folder / "scratch", folder / "site-state"
    scratch.mkdir(exist_ok=True)
    state.mkdir(exist_ok=True)
    run_dir = folder / "run"
    if len(str(run_dir)) > 50:  # the agent would fall back to the shared /tmp/hpctrain-agent-<uid>
        run_dir = Path(tempfile.mkdtemp(prefix="hpctrain-site-", dir="/tmp"))
    run_dir.mkdir(mode=0o700, exist_ok=True)
    (folder / "runtime").write_text(f"{run_dir}\n")
    port = _free_port()
    site_env = {
        "SCRATCH": str(scratch),
        "XDG_STATE_HOME": str(state),
        "XDG_RUNTIME_DIR": str(run_dir),
        **(env or {}),
    }
    setenv = " ".join(f'"{k}={v}"' for k, v in sorted(site_env.items()))
    log = folder / "sshd.log"
    (folder / "sshd_config").write_text(f"""\
ListenAddress 127.0.0.1
Port {port}
HostKey {folder}/host_key
PidFile {folder}/sshd.pid
AuthorizedKeysFile {folder}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
X11Forwarding no
AllowTcpForwarding local
PermitTunnel no
MaxSessions 64
MaxStartups 64
LogLevel VERBOSE
SetEnv {setenv}
Subsystem sftp internal-sftp
{config}
""")
    host_pub = (folder / "host_key.pub").read_text().split()
    (folder / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    log.write_text("")
    subprocess.run(
        [SSHD, "-f", str(folder / "sshd_config"), "-E", str(log)],
        check=True,
        capture_output=True,
        timeout=timeout,
    )  # daemonizes; writes the pid file
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            time.sleep(0.1)
    else:
        down(folder)
        raise RuntimeError(f"sshd did not listen on 127.0.0.1:{port}: {log.read_text()}")
    import pwd

    site = Site(
        dir=str(folder),
        port=port,
        user=pwd.getpwuid(os.getuid()).pw_name,
        identity=str(folder / "user_key"),
        known_hosts=str(folder / "known_hosts"),
        scratch=str(scratch),
        state=str(state),
        log=str(log),
    )
    (folder / "site.json").write_text(json.dumps(asdict(site), indent=2) + "\n")
    return site


def runtime(folder: Path) -> Path:
    """The site's $XDG_RUNTIME_DIR: DIR/run, or a short folder in /tmp when DIR is deep."""
    try:
        return Path((folder / "runtime").read_text().strip())
    except OSError:
        return folder / "run"


def agents(folder: Path) -> list[int]:
    """Pids of the login-node agents running with their sockets in this site's runtime folder."""
    out = []
    for pid_file in sorted((runtime(folder) / "hpctrain").glob("*.pid")):
        try:
            pid = int(pid_file.read_text().strip())
            if b"hpctrain.agent.serve" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except (OSError, ValueError):
            continue
    return out


def down(folder: Path) -> None:
    """Stop the sshd whose pid file is in `folder` (and only that one), and this site's agents."""
    for pid in agents(folder):
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    run_dir = runtime(folder)
    if folder not in run_dir.parents and run_dir.name.startswith("hpctrain-site-"):
        shutil.rmtree(run_dir, ignore_errors=True)  # the /tmp one; agents leave when it goes
    pid_file = folder / "sshd.pid"
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        if Path(f"/proc/{pid}/comm").read_text().strip() != "sshd":
            return  # the pid was reused: not ours
        os.kill(pid, signal.SIGTERM)
    except OSError:
        return
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.05)
    pid_file.unlink(missing_ok=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("up", "down"):
        sys.exit(__doc__)
    if sys.argv[1] == "up":
        print(up(Path(sys.argv[2])).port)
    else:
        down(Path(sys.argv[2]))
