"""The SSH transport against a real sshd on 127.0.0.1: one connection serves many commands, and
each way of failing gives one line that names the host and the fix. No Slurm job is run here."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path


def accepted(site) -> int:
    return Path(site.log).read_text(errors="replace").count("Accepted publickey")


def test_dry_run_resolves_the_sites_variables_there_and_commands_share_one_connection(laptop):
    before = accepted(laptop.site)
    out = laptop.hp(
        "submit",
        "--profile",
        str(laptop.profile),
        "--name",
        "dry",
        "--nodes",
        "2",
        "--dry-run",
        "--",
        "--max-steps=5",
    )
    # $SCRATCH is the site's (the laptop has none): the run folder is under the site's scratch
    assert f"{laptop.site.scratch}/runs/dry" in out.stdout, out.stdout
    assert f"site root@127.0.0.1:{laptop.site.port}" in out.stdout, out.stdout
    assert "nothing was written" in out.stdout
    assert not Path(laptop.site.scratch, "runs", "dry").exists()
    assert not list(Path(laptop.site.dir, "work", "incoming").glob("*")), (
        "upload folder left behind"
    )
    # the dry run wrote no index entry
    assert not (laptop.root / "state" / "hpctrain" / "remote-runs.jsonl").exists()
    # a sweep's dry run on the site: the site's folder, the grid, the array script
    out = laptop.hp(
        "sweep",
        "--profile",
        str(laptop.profile),
        "--name",
        "sw",
        "--grid",
        "optim.lr=1e-3,1e-2",
        "--dry-run",
    )
    assert f"folder: {laptop.site.scratch}/runs/sw" in out.stdout, out.stdout
    assert "#SBATCH --array=0-1" in out.stdout and "1-optim.lr=1e-2" in out.stdout
    # every command of both (resolve, upload, submit, clean up) used one SSH connection
    assert accepted(laptop.site) == before + 1


def _fails(laptop, name: str, **login) -> str:
    prof = laptop.write_profile(name, **login)
    out = laptop.hp("submit", "--profile", str(prof), "--name", "x", "--dry-run", check=False)
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr, out.stderr
    return out.stderr.strip()


def test_each_failure_is_one_line_naming_the_host_and_the_fix(laptop, tmp_path):
    port = laptop.site.port
    closed = subprocess.run(
        [
            "python3",
            "-c",
            "import socket; s=socket.socket(); s.bind(('127.0.0.1',0));print(s.getsockname()[1])",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    err = _fails(laptop, "down", port=closed)
    assert re.search(rf"127\.0\.0\.1:{closed}: host unreachable .*fix: check login\.host", err), err

    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    err = _fails(laptop, "badkey", identity=str(other))
    assert f"127.0.0.1:{port}: authentication failed" in err and "login.identity" in err, err

    laptop.known_hosts.write_text("")
    err = _fails(laptop, "unknownhost")
    assert "host key is not in known_hosts" in err and f"ssh -p {port} root@127.0.0.1" in err, err
    laptop.known_hosts.write_text(Path(laptop.site.known_hosts).read_text())

    err = _fails(laptop, "nopython", remote_python="/nonexistent/bin/python3")
    assert "no Python at login.remote_python '/nonexistent/bin/python3'" in err, err

    err = _fails(laptop, "nohpctrain", remote_python="/usr/bin/python3")
    assert "hpctrain is not installed for /usr/bin/python3" in err, err


def test_doctor_checks_the_way_to_the_site_then_runs_the_sites_doctor(laptop):
    prof = laptop.write_profile("docsite", extends="local")
    out = laptop.hp("doctor", "--profile", str(prof), "--gpus", "1", "--max-mib", "1", timeout=180)
    lines = out.stdout.splitlines()
    assert lines[0] == (
        f"ok   ssh root@127.0.0.1:{laptop.site.port} (control connection, strict host key checking)"
    )
    assert lines[2].startswith("ok   hpctrain ") and f"{laptop.site.scratch}/runs" in lines[3]
    # then the site's own doctor, with the uploaded profile
    assert "hpctrain doctor: profile docsite (local)" in out.stdout
    assert "all checks passed" in out.stdout
    assert not list(Path(laptop.site.dir, "work", "incoming").glob("*")), (
        "upload folder left behind"
    )


def test_a_script_travels_as_the_committed_tree_and_runs_from_the_run_folder(laptop):
    repo = laptop.root / "repo"
    repo.mkdir()
    (repo / "train.py").write_text(
        "import pathlib\nhere = pathlib.Path(__file__).resolve().parent\n"
        "print('ran from', here, 'data', (here / 'data.txt').read_text().strip(), flush=True)\n"
    )
    (repo / "data.txt").write_text("committed\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "code"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    (repo / "data.txt").write_text("uncommitted\n")  # not sent: only the commit travels
    prof = laptop.write_profile("codesite", extends="local")
    out = laptop.hp(
        "submit",
        "--profile",
        str(prof),
        "--script",
        str(repo / "train.py"),
        "--name",
        "mine",
        "--nodes",
        "1",
        "--gpus",
        "1",
        "--wait",
        timeout=180,
    )
    assert "has uncommitted changes; they are not sent" in out.stdout, out.stdout
    assert re.search(r"code git .*repo [0-9a-f]{12} sent with rsync", out.stdout), out.stdout
    run = Path(laptop.site.scratch) / "runs" / "mine"
    assert (run / "code" / "data.txt").read_text() == "committed\n"
    logs = laptop.hp("logs", "mine", "--rank", "0").stdout
    assert f"ran from {run}/code data committed" in logs, logs


def test_a_module_travels_as_the_committed_tree_of_the_repo_it_is_imported_from(laptop):
    """--module pkg.mod: the repository is the one holding the folder the module is imported from
    here (PYTHONPATH=<repo>/src), its committed tree is sent, and the job imports the module from
    the run's code/src. A module outside any git repository is refused before anything is sent."""
    repo = laptop.root / "modrepo"
    (repo / "src" / "mypkg").mkdir(parents=True)
    (repo / "src" / "mypkg" / "__init__.py").write_text("")
    (repo / "src" / "mypkg" / "train.py").write_text(
        "import pathlib\nhere = pathlib.Path(__file__).resolve().parent\n"
        "print('module from', here, 'data', (here.parents[1] / 'data.txt').read_text().strip(),"
        " flush=True)\n"
    )
    (repo / "data.txt").write_text("committed\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "code"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    prof = laptop.write_profile("modsite", extends="local")
    topo = ["--nodes", "1", "--gpus", "1"]

    (laptop.work / "loose").mkdir()  # importable from the current folder, but in no repository
    (laptop.work / "loose" / "__init__.py").write_text("")
    out = laptop.hp(
        "submit", "--profile", str(prof), "--module", "loose", "--name", "l", *topo, check=False
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out
    assert "--module loose is not in a git repository" in out.stderr, out.stderr
    assert "--sync DIR" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr

    laptop.env["PYTHONPATH"] = str(repo / "src")  # how the local run would import it
    try:
        out = laptop.hp(
            "submit",
            "--profile",
            str(prof),
            "--module",
            "mypkg.train",
            "--name",
            "mod",
            *topo,
            "--wait",
            timeout=180,
        )
    finally:
        del laptop.env["PYTHONPATH"]
    assert re.search(r"code git .*modrepo [0-9a-f]{12} sent with rsync", out.stdout), out.stdout
    assert "--module mypkg.train imported from code/src" in out.stdout, out.stdout
    run = Path(laptop.site.scratch) / "runs" / "mod"
    assert (run / "code" / "data.txt").read_text() == "committed\n"
    logs = laptop.hp("logs", "mod", "--rank", "0").stdout
    assert f"module from {run}/code/src/mypkg data committed" in logs, logs


def test_runs_names_a_site_it_cannot_reach_and_goes_on(laptop):
    index = laptop.root / "state" / "hpctrain" / "remote-runs.jsonl"
    index.parent.mkdir(parents=True, exist_ok=True)
    gone = {
        "host": "root@127.0.0.1",
        "port": 1,
        "remote_python": "python3",
        "workdir": "~/.hpctrain",
    }
    index.write_text(
        json.dumps({"name": "old", "path": "/x/old", "login": gone, "profile": "p"}) + "\n"
    )
    out = laptop.hp("runs")
    assert "== root@127.0.0.1:1 ==" in out.stdout, out.stdout
    assert "warning: root@127.0.0.1:1: host unreachable" in out.stderr, out.stderr
    listed = json.loads(laptop.hp("runs", "--json").stdout)
    assert {"site": "root@127.0.0.1:1", "error": listed[-1]["error"]} == listed[-1]
    out = laptop.hp("status", "old", check=False)
    assert (
        out.returncode == 2 and "host unreachable" in out.stderr and "Traceback" not in out.stderr
    )
