"""Submit-time checks and one source for the entry's settings, through the real CLI (--dry-run:
nothing is queued or written; render: the exact script)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def hp(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp / "config"), "XDG_STATE_HOME": str(tmp / "st")}
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


DRY = ("submit", "--dry-run", "--profile", "loopback", "--name", "x")


def test_plain_two_by_two_adapts_the_batch_defaults(tmp_path):
    out = hp(tmp_path, *DRY, "--nodes", "2", "--gpus", "2")
    assert out.returncode == 0, out.stderr
    assert "strategy ddp, global batch 16 = world 4 x micro 4 x accum 1, 100 steps" in out.stdout
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing
    three = hp(tmp_path, *DRY[:3], "local", *DRY[4:], "--nodes", "3", "--gpus", "1")  # 16 / 3
    assert "global batch 24 = world 3 x micro 8 x accum 1" in three.stdout, three.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--", "--train.global_batch=10"],
            "train.global_batch(10) is not divisible by world_size(4) * train.micro_batch(8) = 32",
        ),
        (["--", "--model", "nosuch_pkg.mod:build"], "cannot import nosuch_pkg.mod"),
        (
            ["--strategy", "ddp", "--", "--strategy", "fsdp"],
            "--strategy is given twice and they disagree: `submit --strategy ddp` and the entry's "
            "`--strategy fsdp`",
        ),
        (["--", "--run-dir", "/tmp/elsewhere"], "--run-dir after `--`: hpctrain sets it"),
        (["--", "--train.tracker=nosuch"], "train.tracker: Input should be"),
    ],
)
def test_a_bad_entry_config_is_exit_2_with_the_fix_and_nothing_queued(tmp_path, args, message):
    out = hp(tmp_path, *DRY, "--nodes", "2", "--gpus", "2", *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "runs").exists()


def test_the_entrys_strategy_is_the_one_source(tmp_path):
    # given after `--` only: status and the script say fsdp
    out = hp(tmp_path, *DRY, "--nodes", "2", "--gpus", "1", "--", "--strategy", "fsdp")
    assert out.returncode == 0 and "strategy fsdp," in out.stdout, out.stderr
    # from the entry's --config file: honoured, not overridden by submit's default
    (tmp_path / "c.yaml").write_text("strategy: fsdp\n")
    script = hp(
        tmp_path,
        "render",
        "--profile",
        "loopback",
        "--nodes",
        "2",
        "--gpus",
        "1",
        "--name",
        "x",
        "--",
        "--config",
        str(tmp_path / "c.yaml"),
    )
    assert script.returncode == 0, script.stderr
    assert "--strategy fsdp" in script.stdout and "--strategy ddp" not in script.stdout
    # both places, same value: fine
    same = hp(
        tmp_path, *DRY, "--strategy", "fsdp", "--nodes", "2", "--gpus", "1", "--", "--strategy=fsdp"
    )
    assert same.returncode == 0 and "strategy fsdp," in same.stdout, same.stderr


def test_an_environment_value_is_text_as_typed(tmp_path):
    out = hp(
        tmp_path,
        "render",
        "--profile",
        "loopback",
        "--nodes",
        "1",
        "--gpus",
        "1",
        "--name",
        "x",
        "--set",
        "environment.env.MY_FLAG=true",
        "--set",
        "environment.env.N=007",
    )
    assert out.returncode == 0, out.stderr
    assert 'export MY_FLAG="true"' in out.stdout or "export MY_FLAG=true" in out.stdout
    assert "N=007" in out.stdout or 'N="007"' in out.stdout
