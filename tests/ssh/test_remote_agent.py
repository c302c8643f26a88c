"""The login-node agent (hpctrain/agent/serve.py) behind a socket forwarded over the control
connection (hpctrain/remote/tunnel.py), against the real sshd of tests/ssh/sshd.py and a real
agent: the same output and exit codes as one ssh command per call, no new SSH connection and no new
agent for a later command, the fallback where the site refuses the forward, and the agent's own
guards (another uid, a stale socket, another protocol, idle)."""

from __future__ import annotations

import difflib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sshd
from conftest import VENV_PYTHON, Laptop

from hpctrain.remote import wire

TINY = ["--nodes", "1", "--gpus", "1", "--", "--train.micro_batch=4", "--train.global_batch=4"]


def accepted(site) -> int:
    return Path(site.log).read_text(errors="replace").count("Accepted publickey")


def until(what: str, cond, timeout: float, poll: float = 0.1):
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(poll)
    return value


def sessions(agent: int) -> list[int]:
    """The agent's children that run a command (each leads its own process group; the one spare
    waiting for the next connection does not)."""
    out = []
    for task in Path(f"/proc/{agent}/task").glob("*/children"):
        for pid in task.read_text().split():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if stat[2] == pid and stat[0] != "Z":  # leads its own group, and runs
                out.append(int(pid))
    return out


def with_token(token: str) -> list[int]:
    """Live processes of the agent started with this token (the agent, its spare, sessions)."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if f"--token\0{token}".encode() in cmdline.read_bytes():
                pid = int(cmdline.parent.name)
                if not gone(pid):
                    out.append(pid)
        except (OSError, ValueError):
            continue
    return out


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def timeless(value):
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if k != "age_s"}
    return [timeless(v) for v in value] if isinstance(value, list) else value


def exec_twin(laptop: Laptop, root: Path | Laptop) -> Laptop:
    """A second laptop with the same run index, its site entries marked `agent: false`: every
    command is one ssh command (the path before the agent). Call again after a submit."""
    twin = root if isinstance(root, Laptop) else Laptop(root, laptop.site)
    index = laptop.root / "state" / "hpctrain" / "remote-runs.jsonl"
    lines = [json.loads(x) for x in index.read_text().splitlines()]
    for line in lines:
        line["login"]["agent"] = False
    mine = twin.root / "state" / "hpctrain" / "remote-runs.jsonl"
    mine.parent.mkdir(parents=True, exist_ok=True)
    mine.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return twin


def _as_from_a_terminal() -> None:
    # A shell starts a foreground command with SIGINT at its default; a test run started in the
    # background (`make test &`, nohup) passes SIGINT on ignored, and then Ctrl-C would do nothing.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def follow(lap: Laptop, name: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "logs", name, "--follow"],
        cwd=lap.work,
        env=lap.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
        preexec_fn=_as_from_a_terminal,
    )


def stuck(pid: int) -> str:
    """What a process that did not leave is doing: its signal masks, where it waits, its children."""
    proc = Path(f"/proc/{pid}")
    status = [
        x
        for x in (proc / "status").read_text().splitlines()
        if x.startswith(("Sig", "Shd", "State", "Threads"))
    ]
    kids = []
    for task in proc.glob("task/*/children"):
        for kid in task.read_text().split():
            try:
                kids.append(Path(f"/proc/{kid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                pass
    stacks = [f"{t.name}: {(t / 'wchan').read_text()}" for t in proc.glob("task/*")]
    return f"--follow {pid} did not leave after SIGINT: {status} wchan {stacks} children {kids}"


def test_status_logs_follow_cancel_through_the_agent_match_ssh_exec(laptop, tmp_path):
    site = laptop.site
    prof = laptop.write_profile("agent-local", extends="local")
    before = set(sshd.agents(Path(site.dir)))
    laptop.hp("submit", "--profile", str(prof), "--name", "done", "--wait", *TINY, "--max-steps=3")
    agents = sorted(set(sshd.agents(Path(site.dir))) - before)
    assert len(agents) == 1, agents  # started by the first command of this connection
    first = accepted(site)
    twin = exec_twin(laptop, tmp_path / "twin")
    try:
        # a finished run: the same bytes and exit codes both ways (errors from the site included)
        for args in (
            ["status", "done"],
            ["status", "done", "--json"],
            ["logs", "done"],
            ["logs", "done", "--rank", "0"],
            ["logs", "done", "--rank", "7"],  # exit 2: no such log
            ["cancel", "done"],  # not running: nothing to cancel
            ["runs", "--json"],
        ):
            a, b = laptop.hp(*args, check=False), twin.hp(*args, check=False)
            if "--json" in args:  # "age_s": seconds since the newest metric, a moving clock
                a.stdout, b.stdout = (json.dumps(timeless(json.loads(x.stdout))) for x in (a, b))
            assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr), (
                args,
                "".join(difflib.unified_diff(b.stdout.splitlines(True), a.stdout.splitlines(True))),
                a.stderr,
                b.stderr,
            )
        assert a.returncode == 0 and "Traceback" not in a.stderr

        # a running job: --follow streams, Ctrl-C stops the command on the site, cancel ends it
        laptop.hp("submit", "--profile", str(prof), "--name", "long", *TINY, "--max-steps=100000")
        exec_twin(laptop, twin)
        streams = [follow(laptop, "long"), follow(twin, "long")]

        def started(s: subprocess.Popen) -> None:
            assert s.stdout is not None
            for line in s.stdout:
                if line.startswith("step "):
                    return
            raise AssertionError(f"--follow ended before a step line: {s.wait()} {s.stderr}")

        for s in streams:
            started(s)
        agent = agents[0]
        # one session per command through the agent (an earlier command's may still be leaving)
        kept = until("one session", lambda: x if len(x := sessions(agent)) == 1 else None, 10)
        streams.append(follow(laptop, "long"))
        started(streams[2])
        (session,) = set(sessions(agent)) - set(kept)
        streams[2].send_signal(signal.SIGINT)
        try:
            streams[2].wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(stuck(streams[2].pid)) from None
        assert streams[2].returncode == 130
        until("the interrupted follow's session ends", lambda: gone(session), 15)
        assert not gone(kept[0])
        a, b = laptop.hp("cancel", "long"), twin.hp("status", "long", "--json")
        assert "cancel" in a.stdout and a.returncode == 0, a
        for s in streams[:2]:
            s.communicate(timeout=120)  # --follow ends by itself with the job
        codes = [s.returncode for s in streams[:2]]
        assert codes[0] == codes[1], codes
        a, b = laptop.hp("status", "long"), twin.hp("status", "long")
        assert a.stdout == b.stdout and "CANCELLED" in a.stdout or "FAILED" in a.stdout, a.stdout

        # one SSH connection and one agent served every command of this laptop
        # (the twin's long HOME puts its control socket in the same /tmp fallback folder: it
        # shares the connection, so none is new at all)
        assert accepted(site) == first
        assert sorted(set(sshd.agents(Path(site.dir))) - before) == agents
    finally:
        twin.close()
        laptop.hp("cancel", "long", check=False)


def test_a_site_that_refuses_the_forward_falls_back_to_ssh_with_one_note(tmp_path):
    site = sshd.up(tmp_path / "site", config="AllowStreamLocalForwarding no")
    lap = Laptop(tmp_path / "laptop", site)
    try:
        args = ["submit", "--profile", str(lap.profile), "--name", "dry", "--dry-run"]
        outs = [lap.hp(*args, "--", "--max-steps=2") for _ in range(2)]
        for out in outs:
            assert f"{site.scratch}/runs/dry" in out.stdout and "Traceback" not in out.stderr
        notes = [o.stderr.count("the hpctrain agent is not used") for o in outs]
        assert notes == [1, 0], [o.stderr for o in outs]
        assert "AllowStreamLocalForwarding" in outs[0].stderr
        assert "login.agent: false" in outs[0].stderr
        # the agent it started is told to leave (its socket removed), nothing is left running
        until("the unreachable agent leaves", lambda: not sshd.agents(Path(site.dir)), 15)
        # `login.agent: false` in the profile: ssh exec from the start, no agent, no note
        off = lap.write_profile("noagent", agent="false")
        out = lap.hp("submit", "--profile", str(off), "--name", "dry", "--dry-run")
        assert f"{site.scratch}/runs/dry" in out.stdout and out.stderr.strip() == "", out.stderr
        assert not sshd.agents(Path(site.dir))
        assert accepted(site) == 1
    finally:
        lap.close()
        sshd.down(Path(site.dir))


def _agent_of(site) -> int:
    return until("an agent", lambda: sshd.agents(Path(site.dir)), 10)[0]


def _runs_through(lap: Laptop) -> subprocess.CompletedProcess:
    index = lap.root / "state" / "hpctrain" / "remote-runs.jsonl"
    if not index.exists():
        index.parent.mkdir(parents=True, exist_ok=True)
        login = {
            "host": lap.site.host,
            "port": lap.site.port,
            "identity": lap.site.identity,
            "remote_python": VENV_PYTHON,
            "workdir": f"{lap.site.dir}/work",
            "known_hosts": str(lap.known_hosts),
        }
        index.write_text(json.dumps({"name": "x", "path": "/x", "login": login}) + "\n")
    out = lap.hp("runs", "--json")
    assert "Traceback" not in out.stderr and "not used" not in out.stderr, out.stderr
    return out


def test_a_killed_agent_or_another_protocol_gets_a_fresh_agent(laptop):
    site = laptop.site
    _runs_through(laptop)
    old = _agent_of(site)
    first = accepted(site)
    os.kill(old, signal.SIGKILL)  # its socket file stays behind: stale
    until("the killed agent is gone", lambda: gone(old), 10)
    _runs_through(laptop)
    new = _agent_of(site)
    assert new != old
    sock = next((sshd.runtime(Path(site.dir)) / "hpctrain").glob("*.sock"))
    # a request of another protocol is refused, and that agent leaves
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(str(sock))
    wire.send(conn, b"q", json.dumps({"proto": 999, "argv": ["runs"]}).encode())
    kind, payload = wire.recv(conn) or (b"", b"")
    assert kind == b"r" and json.loads(payload)["error"] == "protocol", (kind, payload)
    until("the refusing agent leaves", lambda: gone(new), 10)
    assert not sock.exists()
    _runs_through(laptop)
    third = _agent_of(site)
    assert third not in (old, new)
    assert accepted(site) == first  # all of it over the one connection
    # the control connection closed: its forwarded socket on the laptop is gone or stale; the
    # next command opens one connection and forwards again to the agent still running there
    ssh = [*_ssh_options(laptop), "-O", "exit", site.host]
    subprocess.run(["ssh", *ssh], env=laptop.env, capture_output=True, timeout=30, check=True)
    _runs_through(laptop)
    assert _agent_of(site) == third and accepted(site) == first + 1


def _ssh_options(lap: Laptop) -> list[str]:
    code = (
        "import json, sys; from hpctrain.remote.ssh import SSH, Login; "
        "print(json.dumps(SSH(Login(*sys.argv[1:3], sys.argv[3], sys.argv[4], "
        "known_hosts=sys.argv[5])).options()))"
    )
    args = [lap.site.host, str(lap.site.port), lap.site.identity, VENV_PYTHON, str(lap.known_hosts)]
    out = subprocess.run(
        [sys.executable, "-c", code, *args], env=lap.env, capture_output=True, text=True
    )
    return json.loads(out.stdout)


def _start(env: dict[str, str], token: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain.agent.serve", "start", "--token", token, *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_agent_refuses_another_uid_and_leaves_when_idle_or_its_socket_goes():
    runtime = Path(tempfile.mkdtemp(prefix="hpctrain-agent-test-", dir="/tmp"))
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    pids: list[int] = []
    try:
        idle = json.loads(_start(env, "a" * 16, "--idle", "1").stdout)
        kept = json.loads(_start(env, "b" * 16).stdout)
        pids = [idle["pid"], kept["pid"]]
        folder = runtime / "hpctrain"
        assert folder.stat().st_mode & 0o777 == 0o700
        assert Path(kept["socket"]).stat().st_mode & 0o777 == 0o600
        again = json.loads(_start(env, "b" * 16).stdout)
        assert again["pid"] == kept["pid"] and again["reused"]  # an agent per token, not per call

        # another uid reaching the socket (the folders opened up for the test) is turned away
        os.chmod(runtime, 0o711)
        os.chmod(folder, 0o711)
        os.chmod(kept["socket"], 0o666)
        probe = (
            "import socket, sys\ns = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
            "try:\n s.sendall(bytes.fromhex(sys.argv[2])); print(repr(s.recv(100)))\n"
            "except OSError as e:\n print('closed', e.errno)"
        )
        hello = json.dumps({"proto": wire.PROTO, "argv": ["--version"]})
        frame = (wire._HEAD.pack(b"q", len(hello)) + hello.encode()).hex()
        other = subprocess.run(
            ["/usr/bin/python3", "-c", probe, kept["socket"], frame],
            user="nobody",
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert other.stdout.strip() in ("b''", "closed 32", "closed 104"), other  # no answer
        (log_file,) = folder.glob(f"{'b' * 16}-*.log")
        log = log_file.read_text()
        assert "refused a connection from uid 65534" in log, log
        # its own uid is served: output and exit code framed
        conn = socket.socket(socket.AF_UNIX)
        conn.connect(kept["socket"])
        wire.send(conn, b"q", hello.encode())
        frames = []
        while (f := wire.recv(conn)) is not None:
            frames.append(f)
        assert [k for k, _ in frames] == [b"s", b"o", b"x"], frames
        assert frames[1][1].startswith(b"hpctrain, version") and frames[2][1] == b"0"

        # a folder that others can enter is refused at start
        os.chmod(folder, 0o755)
        refused = _start(env, "c" * 16)
        assert refused.returncode == 2 and "not a folder private to you" in refused.stderr
        os.chmod(folder, 0o700)

        # idle: leaves by itself; socket removed: leaves too
        Path(kept["socket"]).unlink()
        until("the idle agent leaves", lambda: gone(idle["pid"]), 10)
        assert not Path(idle["socket"]).exists()
        until("the agent without a socket leaves", lambda: gone(kept["pid"]), 15)
        # and nothing of either is left: no spare still waiting for a connection
        until("their spares leave", lambda: not with_token("a" * 16) + with_token("b" * 16), 10)
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", str(runtime)], check=False)
