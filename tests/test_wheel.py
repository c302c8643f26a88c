"""The wheel carries the templates and site profiles: build it, install it (no deps) into a fresh venv
that borrows the outer venv's dependencies but NOT the editable hpctrain, and render from a temporary
directory: the output must equal the golden file."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from hpctrain.kernel import jobenv

REPO = Path(__file__).resolve().parent.parent


def run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert out.returncode == 0, f"{cmd}: {out.stdout}\n{out.stderr}"
    return out


def test_wheel_renders_the_golden(tmp_path):
    dist = tmp_path / "dist"
    run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(dist),
            str(REPO),
        ]
    )
    (wheel,) = dist.glob("hpctrain-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hpctrain/templates/sbatch.sh.j2" in names
    assert {
        "hpctrain/templates/scheduler/slurm.sh.j2",
        "hpctrain/templates/launch/srun.sh.j2",
    } <= set(names)
    assert {
        f"hpctrain/site_configs/{p.name}" for p in (REPO / "site_configs").glob("*.yaml")
    } <= set(names)
    examples = sorted((REPO / "site_configs" / "examples").glob("*.yaml"))
    assert {f"hpctrain/site_configs/examples/{p.name}" for p in examples} <= set(names)

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)]
    )
    site = Path(
        run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
        ).stdout.strip()
    )
    # The outer deps as a plain path entry: .pth files in it (the editable hpctrain's) are not processed.
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        jobenv.PYTHON: "/opt/hpctrain/bin/python",
    }
    where = run(
        [str(py), "-c", "import hpctrain, jinja2; print(hpctrain.__file__)"], cwd=cwd, env=env
    ).stdout
    assert where.startswith(str(site)), f"hpctrain imported from {where}, not from the wheel"
    out = run(
        [
            str(venv / "bin" / "hpctrain"),
            "render",
            "--profile",
            "loopback",
            "--name",
            "golden",
            "--nodes",
            "2",
            "--set",
            "storage.runs_dir=/scratch/runs",
            "--",
            "--max-steps",
            "10",
        ],
        cwd=cwd,
        env=env,
    )
    assert out.stdout == (REPO / "tests" / "golden" / "loopback.sh").read_text()
    # the bundled real-cluster examples are listed from the installed package, as example:NAME
    listed = run([str(venv / "bin" / "hpctrain"), "profiles", "list"], cwd=cwd, env=env).stdout
    assert all(f"example:{p.stem} " in listed for p in examples), listed
