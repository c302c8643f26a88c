"""Running on another supported torch (issue 21): a save that will fail every time ends the run at
the first save with its cause, and a checkpoint written under one supported torch loads and resumes
bit-identical under another, both ways (the `compat` tests: `make test-compat` runs them in the
lane's venv, the oldest supported torch, against the main venv's torch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _faults_common import hp_env

from hpctrain.kernel import jobenv
from hpctrain.service.nodetorch import node_torch_version

REPO = Path(__file__).resolve().parent.parent
VENVS = (REPO / ".venv", REPO / ".venv-compat")  # make venv, make venv-compat

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_save_failing_with_an_importerror_ends_the_run_at_the_first_save(tmp_path) -> None:
    """The failure of torch 2.8 (a private name gone: ImportError in every save) used to train on
    with no checkpoint at all and end with "free space there". Now: FAILED at the first save, the
    cause as status' first line, the newest verified checkpoint named, no free-space advice."""
    env = hp_env(tmp_path) | {
        "PYTHONPATH": os.pathsep.join(
            str(p) for p in (REPO, REPO / "tests/scripts", REPO / "tests")
        ),
        "DS_ACCELERATOR": "cpu",
    }

    def hpctrain(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "hpctrain", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
        )

    common = ["--data", "test_train_e2e:make_data", "--collate", "test_train_e2e:stack"]
    out = hpctrain(
        *("submit", "--profile", "local", "--nodes", "1", "--gpus", "2", "--name", "broken"),
        *("--wait", "--", "--model", "broken_save:make_model", *common),
        *("--max-steps", "30", "--checkpoint-every", "10"),
    )
    assert out.returncode != 0 and "Traceback" not in out.stdout + out.stderr
    run = tmp_path / "runs" / "broken"
    status = hpctrain("status", "broken").stdout
    first = status.splitlines()[0]
    assert first.startswith("broken: FAILED: ImportError: cannot import name '_StorageInfo'"), (
        status
    )
    assert "could not save step 10" in first and "free space" not in status, status
    assert "newest verified checkpoint: none" in first
    # the run ended at the first save: no step after it was trained (step 10's metrics line comes
    # with the next step's reduction, so the last line written is step 9's)
    assert _metrics(run)[-1]["step"] in (9, 10)
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    failed = [e for e in events if e["event"] == "save_failed"]
    assert [(e["step"], e["kind"]) for e in failed] == [(10, "fatal")]


# --- a checkpoint crosses between two supported torches ----------------------------------------


def _other_python() -> Path:
    """The venv's Python that is not this one (the lane's when run from the main venv, and back)."""
    here = Path(sys.prefix).resolve()
    others = [v / "bin" / "python" for v in VENVS if v.resolve() != here]
    found = [p for p in others if p.exists()]
    assert found, f"no second torch: build the lane's venv (make venv-compat), looked at {others}"
    return found[0]


def _torch_of(python: Path | str) -> str | None:
    """`python`'s torch release, read from its torch/version.py (no torch import: seconds)."""
    return node_torch_version(str(python))


def _train(python: Path | str, run: Path, *args: str, stop_at: int | None = None) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith((jobenv.PREFIX, "RANK", "WORLD_SIZE", "MASTER_", "LOCAL_RANK"))
    }
    env |= {"OMP_NUM_THREADS": "1", jobenv.DEVICE: "cpu", "PYTHONPATH": str(REPO)}
    if stop_at is not None:
        env[jobenv.STOP_AT_STEP] = str(stop_at)
    cmd = [
        str(python),
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "train_entry",
        "--run-dir",
        str(run),
        *args,
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    want = 1 if stop_at is not None else 0  # torchrun reports a worker's 75 as its own 1
    assert res.returncode == want, f"{cmd} -> {res.returncode}\n{res.stdout}\n{res.stderr[-3000:]}"
    if stop_at is not None:
        assert f"stopped at step {stop_at}" in res.stdout, res.stdout


_DIGEST = """
import hashlib, sys, torch
from train_entry.checkpoint.writer import load_plain
def walk(h, prefix, obj):
    if isinstance(obj, dict):
        for k in sorted(obj, key=str):
            walk(h, f"{prefix}.{k}", obj[k])
    elif isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"{prefix}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    else:
        h.update(f"{prefix}={obj!r}".encode())
for folder in sys.argv[1:]:
    h = hashlib.sha256()
    walk(h, "", load_plain(folder))
    print(h.hexdigest())
"""


def _digests(python: Path | str, folders: list[Path]) -> list[str]:
    """Every tensor and value of each checkpoint as `python`'s torch loads it, hashed (one
    process for all of them: a start of the lane's torch costs seconds)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [str(python), "-c", _DIGEST, *map(str, folders)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.split()


# A small GPT (the demo's shape, narrower), stopped at step 4 of 8 as a preemption does.
SMALL = [
    "--model.d_model=64",
    "--model.n_layers=2",
    "--model.seq_len=32",
    "--train.micro_batch=4",
    "--train.global_batch=8",
    "--data.num_samples=64",
]
STOP, STEPS = 4, 8


@pytest.mark.compat
@pytest.mark.lane
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_checkpoint_loads_bit_identical_and_resumes_under_the_other_torch_both_ways(
    tmp_path, strategy
) -> None:
    """Written under one torch (stopped at step 4, as a preemption does), loaded under the other:
    every tensor (model, optimizer) and value bit-identical to what the writer holds, and the run
    resumes from it there (step 4 -> 8, from the step, data position and generators saved).
    The two torches' own arithmetic differs (2.7.1's CUDA build and 2.13's CPU build train this
    model to different last bits), so the resumed run is not compared with either's full run."""
    here, there = Path(sys.executable), _other_python()
    versions = (_torch_of(here), _torch_of(there))
    assert None not in versions and versions[0] != versions[1], versions
    args = ["--strategy", strategy, "--max-steps", str(STEPS), *SMALL]
    ways = {"here-there": (here, there), "there-here": (there, here)}
    for name, (first, _) in ways.items():
        _train(first, tmp_path / name, *args, stop_at=STOP)
    folders = [tmp_path / name / "checkpoints" / f"step-{STOP:08d}" for name in ways]
    assert _digests(here, folders) == _digests(there, folders), versions
    for name, (_, second) in ways.items():
        run = tmp_path / name
        _train(second, run, *args)
        log = (run / "train.log").read_text()
        assert f"resumed from {run / 'checkpoints' / f'step-{STOP:08d}'}" in log, log[-2000:]
        steps = [r["step"] for r in _metrics(run)]
        assert steps[-STEPS + STOP :] == list(range(STOP + 1, STEPS + 1)), (name, steps)
        assert len(steps) == len(set(steps)) and (run / "final_params.sha256").exists()
