"""`hpctrain check-resume`: proves a resumable config bit-exact, and for one that is not, names the
first checkpoint that differs and which state (model, optimizer, RNG, data position, ...)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# A user model with a private generator the checkpoint cannot see: resuming it cannot be exact.
LEAKY = """
import torch
from train_entry.model import demo_model


class Leaky(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.gen = torch.Generator().manual_seed(0)

    def forward(self, idx, targets):
        return self.inner(idx, targets) * (1 + torch.rand((), generator=self.gen))


def build(config):
    return Leaky(demo_model(config))
"""


def check(tmp_path, *args):
    env = {
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "check-resume", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )


@pytest.mark.slow
def test_check_resume_proves_the_demo_config_and_finds_a_leak(tmp_path):
    out = check(tmp_path, "--steps", "3", "--keep", str(tmp_path / "good"))
    assert out.returncode == 0, out.stderr[-3000:]
    verdict = json.loads(out.stdout)
    assert verdict["identical"] and verdict["stopped_at"] == 1 and verdict["first_exit_code"] != 0
    assert verdict["uninterrupted_sha256"] == verdict["resumed_sha256"]

    (tmp_path / "leaky.py").write_text(LEAKY)
    out = check(
        tmp_path, "--steps", "3", "--keep", str(tmp_path / "bad"), "--", "--model", "leaky:build"
    )
    assert out.returncode == 1, out.stderr[-3000:]
    verdict = json.loads(out.stdout)
    assert not verdict["identical"]
    diff = verdict["first_difference"]
    # the checkpoint at the interruption matches; the first step after the resume does not; the
    # data position and schedule were restored; the hint points at a generator
    assert diff["step"] == 2 and {"model", "optimizer"} <= set(diff["differs"])
    assert "data" not in diff["differs"] and "scheduler" not in diff["differs"]
    assert "generator" in diff["hint"]


@pytest.mark.slow
def test_check_resume_covers_tensor_and_pipeline_parallel(tmp_path):
    """A layout after `--` (docs/parallel.md): pp 2 x tp 2 on 4 ranks, interrupted and resumed."""
    out = check(
        tmp_path,
        *("--strategy", "fsdp", "--nproc", "4", "--steps", "3"),
        *("--", "--parallel.tp", "2", "--parallel.pp", "2"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    verdict = json.loads(out.stdout)
    assert verdict["identical"] and verdict["stopped_at"] == 1


def test_resume_commands_do_not_import_torch(tmp_path):
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from hpctrain.cli import main\n"
        "for cmd in ('resume', 'preempt', 'check-resume'):\n"
        "    assert CliRunner().invoke(main, [cmd, '--help']).exit_code == 0\n"
        "r = CliRunner().invoke(main, ['resume', 'nosuchrun'])\n"
        "assert r.exit_code == 2 and 'no run' in r.output, r.output\n"
        "from train_entry.checkpoint import newest_verified\n"
        f"assert newest_verified(__import__('pathlib').Path({str(tmp_path)!r})) is None\n"
        "assert 'torch' not in sys.modules and 'deepspeed' not in sys.modules\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "s")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def test_resume_to_another_node_count_checks_the_batch_arithmetic(tmp_path):
    from hpctrain.kernel.errors import UserError
    from hpctrain.service.resume import _check_batch

    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps({"train": {"global_batch": 16, "micro_batch": 4, "grad_accum": None}})
    )
    _check_batch(cfg, world=2, nodes=2)  # 16 = 2 x 4 x 2
    with pytest.raises(UserError, match=r"global_batch\(16\) does not split over 3 ranks"):
        _check_batch(cfg, world=3, nodes=3)
    cfg.write_text(json.dumps({"train": {"global_batch": 16, "micro_batch": 4, "grad_accum": 2}}))
    _check_batch(cfg, world=2, nodes=2)
    with pytest.raises(UserError, match=r"grad_accum\(2\)"):
        _check_batch(cfg, world=1, nodes=1)


def test_check_resume_reports_a_bad_config_before_launching_anything(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "check-resume",
            "--keep",
            str(tmp_path / "k"),
            "--",
            "--optim.lrr=3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "optim.lrr" in proc.stderr and "did you mean 'optim.lr'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "k" / "full").exists()
