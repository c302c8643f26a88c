"""`submit --strategy auto` carries the plan's settings into the run; `--params` reads the same in
every command; `plan --model` finds the current folder's package; a layout asked with the strategy
left at its default takes fsdp (issue 34). In-process CliRunner: nothing is queued."""

from __future__ import annotations

import sys
import textwrap

import pytest
from click.testing import CliRunner

from hpctrain.kernel import jobenv
from hpctrain.kernel.counts import parse_count
from hpctrain.kernel.errors import UserError


@pytest.fixture
def invoke(tmp_path, monkeypatch):
    """Isolated config/state, cwd in tmp_path; returns (exit code, output)."""
    from hpctrain.cli import main

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("SCRATCH", str(tmp_path))  # generic-ib's runs_dir
    monkeypatch.delenv(jobenv.SITE_PATH, raising=False)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        res = runner.invoke(main, list(args))
        return res.exit_code, res.output

    return run


def entry_args(script: str) -> str:
    return next(line for line in script.splitlines() if line.startswith("hpctrain_entry="))


GENERIC = ("--profile", "generic-ib", "--name", "a")


def test_auto_carries_the_layout_precision_and_batch_into_the_run(invoke):
    # 70B on 8 x 8: tensor parallel inside the node, FSDP over the rest, micro-batch 1
    code, out = invoke(
        "render", *GENERIC, "--nodes", "8", "--strategy", "auto", "--params", "70000000000"
    )
    assert code == 0, out
    line = entry_args(out)
    assert "--strategy fsdp" in line and "--parallel.tp=2" in line and "--parallel.pp=1" in line
    assert "--train.precision=bf16" in line and "--train.micro_batch=1" in line
    assert "--train.global_batch=64" in line  # dp 32 x micro 1 x accumulation 2
    # 405B on 16 x 8 needs activation checkpointing: carried too
    code, out = invoke(
        "render", *GENERIC, "--nodes", "16", "--strategy", "auto", "--params", "405000000000"
    )
    assert code == 0, out
    assert "--train.activation_checkpointing=true" in entry_args(out)


def test_auto_dry_run_shows_what_it_carries_and_the_users_flags_win(invoke):
    args = ("submit", *GENERIC, "--nodes", "16", "--strategy", "auto")
    code, out = invoke(*args, "--params", "405000000000", "--dry-run")
    assert code == 0, out
    text = " ".join(out.split())
    assert "auto: tp2_pp1_dp64, tp 2 x pp 1 x dp 64, bf16, activation checkpointing" in text
    assert "micro 1 x accum 2" in text  # not train_entry's default micro 8
    # the plan starts from the user's micro-batch and precision after `--` and sets what fits:
    # micro-batch 1 x accumulation 2 keeps their global batch of 16 GPUs x 2
    user = ("--", "--train.micro_batch", "2", "--train.precision", "fp32")
    code, out = invoke(
        "render", *GENERIC, "--nodes", "2", "--strategy", "auto", "--params", "7e9", *user
    )
    assert code == 0, out
    line = entry_args(out)
    assert "--train.precision=fp32 --train.micro_batch=1 --train.global_batch=32)" in line
    assert "--train.micro_batch 2" not in line


def test_params_takes_the_same_forms_in_every_command(invoke):
    for form in ("7e9", "7B", "7000000000"):
        code, out = invoke(
            "render", *GENERIC, "--nodes", "2", "--strategy", "auto", "--params", form
        )
        assert code == 0, out
        code, out = invoke("plan", "--params", form, "--gpu-mem-gib", "80", "--json")
        assert code == 0 and '"params": 7000000000' in out
    code, out = invoke("render", "--profile", "local", "--strategy", "auto", "--params", "7x")
    assert code == 2 and out.strip().splitlines() == [
        "Error: --params '7x' is not a parameter count; write e.g. 7000000000, 7e9 or 7B"
    ]
    # the one parser both use (hpctrain/kernel/counts.py)
    assert parse_count("7e9") == parse_count("7B") == parse_count("7_000_000_000") == 7 * 10**9
    assert parse_count("350M") == 350 * 10**6 and parse_count(125) == 125
    for bad in ("7x", "inf", "nan", "0", "-3", 0):
        with pytest.raises(UserError, match="--params"):
            parse_count(bad)


def test_plan_model_imports_from_the_current_folder(invoke, tmp_path, monkeypatch):
    """`hpctrain` is a console script: its sys.path has no current folder; plan adds it as submit's
    nodes (python -m) do."""
    pkg = tmp_path / "mypkg_issue34"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "hf.py").write_text(
        textwrap.dedent(
            """
            import torch

            def build():
                return torch.nn.Sequential(torch.nn.Linear(100, 100), torch.nn.Linear(100, 10))
            """
        )
    )
    path = [p for p in sys.path if p not in ("", str(tmp_path))]
    monkeypatch.setattr(sys, "path", path)
    monkeypatch.delitem(sys.modules, "mypkg_issue34", raising=False)
    monkeypatch.delitem(sys.modules, "mypkg_issue34.hf", raising=False)
    code, out = invoke("plan", "--model", "mypkg_issue34.hf:build", "--gpu-mem-gib", "80", "--json")
    assert code == 0, out
    assert '"params": 11110' in out  # 100*100+100 + 100*10+10


def test_a_layout_with_the_default_strategy_takes_fsdp_and_says_so(invoke, tmp_path):
    local = ("--profile", "local", "--nodes", "1", "--gpus", "4", "--name", "tp")
    code, out = invoke("render", *local, "--", "--parallel.tp", "2")
    assert code == 0, out
    assert "--strategy fsdp --parallel.tp 2" in entry_args(out)
    runs = f"storage.runs_dir={tmp_path}/runs"
    code, out = invoke("submit", *local, "--set", runs, "--dry-run", "--", "--parallel.tp", "2")
    assert code == 0, out
    assert "strategy fsdp (picked for --parallel.tp 2: ddp, the default, does not compose" in out
    # an explicit ddp stays an error, with its fix
    for explicit in (("--strategy", "ddp", "--"), ("--", "--strategy", "ddp")):
        code, out = invoke("render", *local, *explicit, "--parallel.tp", "2")
        assert code == 2 and "does not compose with tp/pp" in out and "use --strategy fsdp" in out
