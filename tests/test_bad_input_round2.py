"""Issue 20, item 4 (the end): the preflight gate enters the launch's own container, and inputs that
were tracebacks are one line and exit 2 (`--code`, very long names, a huge grid, a FIFO in a
--sync folder, a run.yaml or checkpoint this hpctrain cannot read, a garbled run index)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from _trust_common import cli, write

from hpctrain.jobs.request import JobRequest
from hpctrain.kernel import jobenv
from hpctrain.profiles import resolve
from hpctrain.render.script import render


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "xdg"
    home.mkdir(mode=0o755)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    monkeypatch.setenv(jobenv.PYTHON, "/opt/py/bin/python")
    monkeypatch.chdir(tmp_path)
    return home


# --- the preflight gate runs in the launch's container -----------------------------------------------


def _lines(flags: dict) -> tuple[list[str], str]:
    profile = resolve("loopback", {"preflight.enabled": True, **flags})
    text = render(profile, JobRequest.build(profile, name="t", nodes=1), "/tmp/runs/t")
    check = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("check+=(")]
    launch = next(ln for ln in text.splitlines() if "# environment.container" in ln)
    return check, launch.split("+=", 1)[1].split("  #")[0]


@pytest.mark.parametrize(
    "flags",
    [
        {"environment.container.kind": "pyxis", "environment.container.image": "$IMG"},
        {
            "environment.container.kind": "singularity",
            "environment.container.image": "/x.sif",
            "environment.container.binary": "/opt/s/bin/singularity",
            "slurm.gpus_per_node": 4,
        },
        {"environment.container.kind": "shifter", "environment.container.image": "docker:a/b:1"},
        {"environment.container.kind": "edf", "environment.container.image": "my-env"},
    ],
)
def test_the_preflight_gate_enters_the_same_container_as_the_launch(flags) -> None:
    check, launch = _lines(flags)
    assert f"check+={launch}" in check, (check, launch)
    assert not any("apptainer" in c for c in check)  # before: every kind but pyxis
    if flags["environment.container.kind"] == "pyxis":
        assert '--container-image="$IMG"' in launch  # expands on the node, never quoted literally
    if flags["environment.container.kind"] == "singularity":
        assert launch.startswith('("/opt/s/bin/singularity" exec --nv ')


# --- --code ---------------------------------------------------------------------------------------


def _upload(tmp_path: Path) -> Path:
    code = tmp_path / "work" / "incoming" / "t-0123abcd" / "code"
    write(code / "train.py", "print('hi')\n")
    return code


def test_submit_code_with_a_script_outside_it_is_one_line(tmp_path) -> None:
    code = _upload(tmp_path)
    other = write(tmp_path / "elsewhere" / "train.py", "print('x')\n")
    out = cli(
        "submit", "--profile", "local", "--name", "t", "--code", str(code), "--script", str(other)
    )
    assert out.exit_code == 2 and f"is not inside --code {code}" in out.output, out.output
    assert not (tmp_path / "runs" / "t").exists() and (code / "train.py").is_file()


def test_submit_code_takes_only_an_upload_folder_and_never_moves_another(tmp_path) -> None:
    write(tmp_path / "train.py", "print('hi')\n")
    (tmp_path / "sub").mkdir()
    for given in (".", str(tmp_path / "sub" / ".."), str(tmp_path)):
        out = cli(
            "submit", "--profile", "local", "--name", "t", "--code", given, "--script", "train.py"
        )
        assert out.exit_code == 2 and "not the upload folder of a remote submit" in out.output
    assert (tmp_path / "train.py").is_file() and not (tmp_path / "runs" / "t").exists()
    out = cli("sweep", "--profile", "local", "--name", "s", "--code", ".", "--grid", "a=1,2")
    assert out.exit_code == 2 and "not the upload folder" in out.output, out.output


def test_sweep_grid_key_that_is_the_run_folder_is_refused(tmp_path) -> None:
    for key in ("run-dir", "run-d", "strat"):
        out = cli(
            "sweep", "--profile", "local", "--nodes", "1", "--name", "sw",
            "--grid", f"{key}=a,b", "--dry-run",
        )  # fmt: skip
        assert out.exit_code == 2 and "after `--`" in out.output, out.output
    assert not (tmp_path / "runs" / "sw").exists()


# --- long names, huge grids, FIFOs, unreadable run records -----------------------------------------


@pytest.mark.parametrize("command", ["status", "logs", "cancel", "report"])
def test_a_5000_character_name_is_one_line(command) -> None:
    out = cli(command, "a" * 5000)
    assert out.exit_code == 2 and "(5000 characters) is not a run name or path" in out.output


def test_a_million_point_grid_is_refused_before_it_is_built() -> None:
    values = ",".join(str(i) for i in range(1024))
    out = cli(
        "sweep", "--profile", "local", "--name", "big", "--grid", f"a={values}",
        "--grid", f"b={values}", "--dry-run",
    )  # fmt: skip
    assert out.exit_code == 2 and "the grid has 1048576 points (1024 x 1024)" in out.output


def test_a_fifo_in_a_sync_folder_is_skipped_with_a_warning(tmp_path) -> None:
    from hpctrain.remote.code import pack

    src = tmp_path / "src"
    write(src / "train.py", "print('hi')\n")
    os.mkfifo(src / "pipe")
    dest = tmp_path / "dest"
    dest.mkdir()
    code = pack(dest, script=str(src / "train.py"), sync=str(src))
    assert code is not None and code.warning is not None and "pipe" in code.warning
    assert (dest / "train.py").is_file() and not (dest / "pipe").exists()


def _run(tmp_path: Path) -> Path:
    from hpctrain.runs.folder import RunDir

    profile = resolve("local", {})
    run = RunDir(tmp_path / "runs" / "r")
    run.create(profile=profile, request=JobRequest.build(profile, name="r"), script="exit 1\n")
    (run.path / "state.json").write_text('{"state": "FAILED", "exit_code": 1}\n')
    return run.path


def _edit(path: Path, change) -> None:
    data = yaml.safe_load((path / "run.yaml").read_text())
    change(data)
    (path / "run.yaml").write_text(yaml.safe_dump(data))


def test_resume_with_a_request_key_this_version_does_not_know_is_one_line(tmp_path) -> None:
    path = _run(tmp_path)
    _edit(path, lambda d: d["request"].update(colour="blue"))
    out = cli("resume", str(path), "--dry-run")
    assert out.exit_code == 2 and "run.yaml: request.colour is not a request key" in out.output


def test_resume_when_the_frozen_profile_no_longer_validates_is_one_line(tmp_path) -> None:
    path = _run(tmp_path)
    _edit(path, lambda d: d["profile"]["slurm"].update(gpus_per_node="many"))
    out = cli("resume", str(path), "--dry-run")
    assert out.exit_code == 2 and "run.yaml: profile.slurm.gpus_per_node: " in out.output
    assert "no longer validates" in out.output


def test_resume_skips_a_manifest_without_a_step(tmp_path) -> None:
    path = _run(tmp_path)
    step = path / "checkpoints" / "step-00000005"
    write(step / "x.bin", "abc")
    manifest = {
        "files": {
            "x.bin": {
                "size": 3,
                "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            }
        }
    }
    write(step / "MANIFEST.json", json.dumps(manifest))
    out = cli("resume", str(path), "--dry-run")
    assert "Traceback" not in out.output and "has no step" in out.output, out.output


def test_status_skips_a_run_index_line_whose_path_is_a_number(tmp_path) -> None:
    index = tmp_path / "state" / "hpctrain" / "runs.jsonl"
    write(index, '{"name": "x", "path": 5}\n{"name": 7, "path": "/nowhere"}\n')
    out = cli("status", "x")
    assert out.exit_code == 2 and "no run 'x'" in out.output, out.output
    assert cli("runs").exit_code == 0
