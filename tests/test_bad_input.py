"""Inputs that were tracebacks are one line and exit 2 (issue 20 item 4, issue 33 finding 5):
`--code`, very long names, a huge grid, a FIFO in a --sync folder, a run.yaml or checkpoint this
hpctrain cannot read, a garbled run index; an export of a folder whose `.metadata` is not DCP's, a
400-digit --max-shard-size, a 300-character --out, `plan` with an infinite or NaN count or memory.
`status`, `runs` and sweep tables print a run folder's text with its terminal escape sequences
written out (an event set the terminal title)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import yaml
from _trust_common import cli, write

from hpctrain.jobs.request import JobRequest
from hpctrain.kernel import jobenv, layout
from hpctrain.kernel.checkpoint import staging_name, step_name, write_manifest
from hpctrain.kernel.fatal import SPARE_SWAPPED
from hpctrain.profiles import resolve


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


def one_line(out, *words: str) -> str:
    text = out.output.strip()
    assert out.exit_code == 2, text
    assert len(text.splitlines()) == 1 and text.startswith("Error: "), text
    assert "Traceback" not in text
    for w in words:
        assert w in text, text
    return text


# --- export ---------------------------------------------------------------------------------------


def _checkpoint(tmp_path: Path, metadata: bytes, name: str = "run") -> Path:
    """A run folder whose one checkpoint verifies and holds `metadata` as DCP's `.metadata`."""
    ckpt = tmp_path / name / "checkpoints"
    staging = ckpt / staging_name(1)
    staging.mkdir(parents=True)
    (staging / ".metadata").write_bytes(metadata)
    write_manifest(staging, ckpt / step_name(1), {"step": 1, "strategy": "ddp", "world_size": 1})
    (staging).rename(ckpt / step_name(1))
    return tmp_path / name


@pytest.mark.parametrize(
    ("metadata", "why"),
    [
        (b"\x00garbage, not a pickle", "UnpicklingError"),
        (b"", "EOFError"),
        (pickle.dumps({"state_dict_metadata": {}}), "it holds a dict, not DCP's Metadata"),
        (pickle.dumps([1, 2, 3]), "it holds a list"),
        (pickle.dumps(Path("/x")), "it holds a PosixPath"),  # an allowed class, the wrong one
        (b"cbuiltins\neval\n(S'1'\ntR.", "it names builtins.eval"),
        (b"cbuiltins\ngetattr\n(cbuiltins\nobject\nS'x'\ntR.", "it names builtins.object"),
    ],
)
def test_export_of_a_metadata_file_that_is_not_dcp_is_one_line(tmp_path, metadata, why) -> None:
    run = _checkpoint(tmp_path, metadata)
    out = cli("export", str(run), "--out", str(tmp_path / "out"))
    one_line(out, ".metadata is not a DCP checkpoint's metadata", why, "refusing to load it")
    assert not (tmp_path / "out").exists()


def test_a_crafted_metadata_with_wrong_field_types_is_one_line(tmp_path) -> None:
    from torch.distributed.checkpoint.metadata import Metadata

    md = Metadata(state_dict_metadata={"app.model.w": "not a tensor description"})
    out = cli("export", str(_checkpoint(tmp_path, pickle.dumps(md))))
    one_line(out, "its entry 'app.model.w' is not a tensor's or bytes' description")


def test_an_export_error_writes_out_the_escape_sequences_of_a_folder_name(tmp_path) -> None:
    run = _checkpoint(tmp_path, b"x", name="run\x1b]0;owned\x07")
    out = cli("export", str(run))
    one_line(out, "run\\x1b]0;owned\\x07/checkpoints", "is not a DCP checkpoint's metadata")
    assert "\x1b" not in out.output


@pytest.mark.parametrize("size", ["1" + "0" * 400, "9" * 400 + "GB", "0.0000001", "2000TB"])
def test_a_max_shard_size_past_any_file_is_one_line(tmp_path, size) -> None:
    out = cli("export", str(tmp_path), "--max-shard-size", size)
    one_line(out, "--max-shard-size", "1 byte to 1PB")


def test_a_300_character_out_is_one_line_and_writes_nothing(tmp_path) -> None:
    run = _checkpoint(tmp_path, b"")
    out = cli("export", str(run), "--out", str(tmp_path / ("w" * 300)))
    one_line(out, "--out", "too long", "give a shorter --out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "xdg"]  # xdg: the fixture's


def test_an_out_where_no_folder_can_be_made_is_one_line(tmp_path) -> None:
    run = _script_run(tmp_path)
    (tmp_path / "file").write_text("x")
    out = cli("export", str(run), "--out", str(tmp_path / "file" / "w"))
    one_line(out, "--out", "cannot create", "Not a directory")
    long_name = "n" * 250  # fits the folder, but not with the staging folder's suffix
    res = cli("export", str(run), "--out", str(tmp_path / long_name))
    assert res.exit_code == 0 and (tmp_path / long_name / "model.safetensors").is_file()


def _script_run(tmp_path: Path) -> Path:
    import torch

    from hpctrain import runtime

    run = tmp_path / "script"
    if not run.exists():
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(jobenv.RUN_DIR, str(run))
            runtime.Checkpoint(run / "checkpoints").save(1, {"model": {"w": torch.ones(2)}})
    return run


# --- plan -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--params", "inf"], ["--params 'inf' is not a parameter count"]),
        (["--params", "1e400"], ["--params '1e400' is not a parameter count"]),
        (["--params", "nan"], ["--params 'nan' is not a parameter count"]),
        (["--params", "1e300"], ["--params 100000... (301 digits): not a realistic value"]),
        (["--gpu-mem-gib", "nan"], ["--gpu-mem-gib nan: give the memory in GiB"]),
        (["--gpu-mem-gib", "inf"], ["--gpu-mem-gib inf: give the memory in GiB"]),
        (["--gpu-mem-gib", "1e400"], ["--gpu-mem-gib inf: give the memory in GiB"]),
        (["--host-mem-gib", "nan"], ["--host-mem-gib nan: give the memory in GiB"]),
        (["--gpus", "9" * 30], ["--gpus 999999... (30 digits): not a realistic value"]),
        (["--layers", str(10**21)], ["--layers 1000000000000000000000: not a realistic"]),
    ],
)
def test_plan_with_a_value_no_machine_has_is_one_line(args, words) -> None:
    base = {"--params": "7e9", "--gpu-mem-gib": "80"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    out = cli("plan", *(x for kv in base.items() for x in kv))
    one_line(out, *words)


# --- status prints run-folder text with its escape sequences written out ----------------------------

# a title, a cleared screen, C1's CSI, a right-to-left override, a newline of its own
HOSTILE = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202eend\nforged: line"


def _failed_run(tmp_path: Path) -> Path:
    from hpctrain.runs.folder import RunDir

    profile = resolve("local", {})
    run = RunDir(tmp_path / "runs" / "r")
    run.create(profile=profile, request=JobRequest.build(profile, name="r"), script="exit 1\n")
    path = run.path
    (path / "state.json").write_text('{"state": "FAILED", "exit_code": 1}\n')
    events = [
        {"event": SPARE_SWAPPED, "job_id": "1", "out": "n1", "in": "n9", "reason": HOSTILE},
        {"event": "preflight", "bad": {"n3" + HOSTILE: "bad " + HOSTILE}},
    ]
    (path / layout.EVENTS).write_text("".join(json.dumps(e) + "\n" for e in events))
    (path / layout.LOGS).mkdir(exist_ok=True)
    (path / layout.LOGS / "node-0.log").write_text(f"error: died {HOSTILE}\n")
    return path


def test_status_writes_out_escape_sequences_and_json_keeps_the_text(tmp_path) -> None:
    path = _failed_run(tmp_path)
    out = cli("status", str(path))
    assert out.exit_code == 0, out.output
    text = out.output
    assert not any(c in text for c in "\x1b\x07\x9b\u202e"), repr(text)
    assert "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u202eend\\nforged: line" in text
    assert "\nforged: line" not in text  # the value's own newline is not a line of the layout
    assert text.count("\n") == len(text.splitlines())  # every line ended by the layout
    lines = text.splitlines()
    assert lines[0].startswith("r: FAILED: died \\x1b]0;owned")
    assert any(x.startswith("  spare swap: n1 out, n9 in") for x in lines), text
    assert any(x.startswith("  bad node n3\\x1b") for x in lines), text

    raw = cli("status", str(path), "--json")
    assert raw.exit_code == 0 and "\x1b" not in raw.output and "\\u001b]0;owned" in raw.output
    info = json.loads(raw.output)
    assert info["spares"]["swaps"][0]["reason"] == HOSTILE  # the text itself, JSON-escaped
    assert info["reason"] == f"died {HOSTILE}".split("\n")[0]


def test_runs_and_sweep_tables_write_out_escape_sequences(tmp_path) -> None:
    path = _failed_run(tmp_path)
    path.rename(path.with_name("r" + HOSTILE.replace("\n", " ")))  # a folder name is text too
    out = cli("runs", "--runs-dir", str(tmp_path / "runs"))
    assert out.exit_code == 0, out.output
    assert not any(c in out.output for c in "\x1b\x07\x9b\u202e"), repr(out.output)
    assert "r\\x1b]0;owned" in out.output.replace("\n", ""), out.output
    from hpctrain.cli.table import plain_table

    table = plain_table(["a", "b"], [[HOSTILE, "x"]])
    assert "\x1b" not in table and "\\x1b]0;owned" in table and len(table.splitlines()) == 3
