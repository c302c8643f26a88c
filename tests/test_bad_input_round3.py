"""Issue 33, finding 5: inputs that were tracebacks are one line and exit 2 (an export of a folder
whose `.metadata` is not DCP's, a 400-digit --max-shard-size, a 300-character --out, `plan` with an
infinite or NaN count or memory), and `status` prints a run folder's text with its terminal escape
sequences written out (an event set the terminal title)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from _trust_common import cli

from hpctrain.jobs.request import JobRequest
from hpctrain.kernel import jobenv, layout
from hpctrain.kernel.checkpoint import staging_name, step_name, write_manifest
from hpctrain.kernel.fatal import SPARE_SWAPPED
from hpctrain.profiles import resolve


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    monkeypatch.chdir(tmp_path)


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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


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
