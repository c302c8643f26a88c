"""A bad parallel layout is refused by `hpctrain submit` before anything is queued: exit 2, one line
per problem naming the key and its fix, no run folder, no job. Through the real CLI and a real
(not dry-run) submit on the local profile, whose executor would otherwise start the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def submit(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp / "config"), "XDG_STATE_HOME": str(tmp / "st")}
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "submit", "--name", "bad", *args],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# the demo GPT sized so tp 3 divides its heads, sequence and vocabulary: only the layout is wrong
TP3_MODEL = (
    "--model.n_heads=6",
    "--model.d_model=48",
    "--model.seq_len=24",
    "--model.vocab_size=48",
)


@pytest.mark.parametrize(
    "topology, entry, lines",
    [
        (  # 3 nodes x 2 = world 6 divides by 3, but tp 3 would cross nodes
            ("--nodes", "3", "--gpus", "2"),
            ("--parallel.tp=3", *TP3_MODEL),
            [
                "--parallel.tp: tp(3) does not divide the GPUs per node(2): tensor parallel must "
                "stay inside a node (its all-reduces run every layer); set --parallel.tp to one "
                "of 1, 2"
            ],
        ),
        (  # 3 x 1 = world 3 divides by 3, the 8 layers do not
            ("--nodes", "3", "--gpus", "1"),
            (
                "--parallel.pp=3",
                "--model.n_layers=8",
                "--train.global_batch=6",
                "--train.micro_batch=3",
            ),
            [
                "--parallel.pp: pp(3) stages do not divide the model's 8 layers; set "
                "--parallel.pp to one of 2, 4, 8, or use a model with a multiple of 3 layers"
            ],
        ),
        (  # world 4 is not a multiple of tp 2 x pp 3 = 6 (6 layers, so the split is fine)
            ("--nodes", "2", "--gpus", "2"),
            ("--parallel.tp=2", "--parallel.pp=3", "--model.n_layers=6"),
            [
                "--parallel: world size(4) is not divisible by tp(2) * pp(3) = 6, so no "
                "data-parallel size fills it; use a world size that is a multiple of 6 (nodes x "
                "gpus), or tp * pp among the divisors of 4: 1, 2, 4"
            ],
        ),
    ],
    ids=["tp3-on-2-gpus-per-node", "pp3-on-8-layers", "world-not-divisible"],
)
def test_bad_layout_is_refused_before_queueing(tmp_path, topology, entry, lines):
    out = submit(tmp_path, "--profile", "local", *topology, "--", "--strategy", "fsdp", *entry)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    problems = [x.strip() for x in out.stderr.splitlines() if x.strip().startswith("--parallel")]
    assert problems == lines, out.stderr  # one line each, with the fix, and nothing else wrong
    assert "nothing was queued" in out.stderr
    assert not (tmp_path / "runs").exists() and "submitted" not in out.stdout


def test_tp_stays_inside_the_profiles_fast_link_domain(tmp_path):
    """slurm.gpus_per_domain below the node (two NVLink islands): tp must divide the island."""
    args = ("--profile", "local", "--nodes", "1", "--gpus", "4", "--dry-run")
    island = ("--set", "slurm.gpus_per_domain=2")
    entry = ("--", "--strategy", "fsdp", "--parallel.tp=4", "--model.d_model=64")
    out = submit(tmp_path, *args, *island, *entry)
    assert out.returncode == 2, out.stdout + out.stderr
    assert (
        "--parallel.tp: tp(4) does not divide the profile's fast-link domain "
        "(slurm.gpus_per_domain: 2 GPUs): tensor parallel must stay inside it; set "
        "--parallel.tp to one of 1, 2" in out.stderr
    ), out.stderr
    ok = submit(tmp_path, *args, *entry)  # the node is the domain: tp 4 fits
    assert ok.returncode == 0, ok.stderr
