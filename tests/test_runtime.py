"""hpctrain.runtime, the API for users' own scripts: torch-free parts, the stop flag, checkpoints
in train_entry's format (one process here; the examples run it multi-node in test_examples_slurm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.kernel import jobenv

REPO = Path(__file__).resolve().parent.parent


def py(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stderr
    return out


def test_import_needs_neither_torch_nor_click_and_reads_the_job_environment(tmp_path):
    stop = tmp_path / "STOP"
    code = f"""
import sys, os, signal
sys.modules['torch'] = None          # any import of torch now fails
from hpctrain import runtime
assert 'click' not in sys.modules, 'runtime imported click'
assert runtime.run_dir() == __import__('pathlib').Path({str(tmp_path)!r})
assert runtime.restart_count() == 3
assert runtime.should_stop() is False
open({str(stop)!r}, 'w').close()      # what the batch shell's trap does
assert runtime.should_stop() is True
assert runtime.stop_reason().startswith('stop file'), runtime.stop_reason()
print('ok')
"""
    env = {
        jobenv.RUN_DIR: str(tmp_path),
        jobenv.RESTART_COUNT: "3",
        jobenv.STOP_FILE: str(stop),
    }
    assert py(code, env).stdout.strip() == "ok"


def test_a_signal_raises_the_flag_without_a_stop_file():
    code = """
import os, signal
from hpctrain import runtime
assert not runtime.should_stop()
os.kill(os.getpid(), signal.SIGUSR2)
assert runtime.should_stop() and runtime.stop_reason() == 'SIGUSR2'
print('ok')
"""
    assert py(code, {jobenv.STOP_FILE: ""}).stdout.strip() == "ok"


def test_run_dir_outside_hpctrain_says_how_to_fix(monkeypatch):
    from hpctrain import runtime

    monkeypatch.delenv(jobenv.RUN_DIR, raising=False)
    monkeypatch.setattr(runtime.job, "_chosen", [])  # the module that holds it
    with pytest.raises(RuntimeError, match=r"runtime.run_dir\('runs/NAME'\)"):
        runtime.run_dir()


def test_checkpoint_round_trip_in_train_entrys_format(tmp_path, capsys):
    import torch

    from hpctrain import runtime
    from train_entry.checkpoint import newest_verified, verify

    ckpt = runtime.Checkpoint(tmp_path / "checkpoints", keep=2)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    for step in (3, 5, 7):
        torch.manual_seed(step)
        ckpt.save(
            step,
            {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "data": {"epoch": 0, "offset": step * 8},
            },
        )
    after_save = torch.rand(3)  # what the generator gives after the save
    folders = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert folders == ["latest", "step-00000005", "step-00000007"]  # keep=2 pruned step 3
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step-00000007\n"
    manifest, why = verify(tmp_path / "checkpoints" / "step-00000007")  # train_entry's verifier
    assert why is None and manifest["step"] == 7 and manifest["world_size"] == 1
    assert set(manifest["files"]) == {"state.pt", "rng/rank-00000.pt"}
    assert newest_verified(tmp_path / "checkpoints")[0].name == "step-00000007"

    torch.manual_seed(999)
    found = runtime.Checkpoint(tmp_path / "checkpoints").load()
    assert found.step == 7 and found.state["data"] == {"epoch": 0, "offset": 56}
    assert torch.equal(torch.rand(3), after_save)  # this rank's RNG came back too
    fresh = torch.nn.Linear(4, 2)
    fresh.load_state_dict(found.state["model"])
    assert runtime.params_sha256(fresh) == runtime.params_sha256(model)

    # a damaged newest checkpoint is reported and skipped, never deleted
    state = tmp_path / "checkpoints" / "step-00000007" / "state.pt"
    state.write_bytes(state.read_bytes()[:-10])
    found = runtime.Checkpoint(tmp_path / "checkpoints").load()
    assert found.step == 5
    assert "step-00000007 skipped" in capsys.readouterr().err and state.exists()


def test_log_metrics_writes_what_status_and_report_read(tmp_path, monkeypatch):
    from hpctrain import runtime

    monkeypatch.setenv(jobenv.RUN_DIR, str(tmp_path))
    monkeypatch.setattr(runtime.job, "_last", {})
    runtime.log_metrics(1, total=10, loss=2.5, samples=16)
    runtime.log_metrics(2, total=10, loss=2.0, samples=16)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[1]["loss"] == 2.0
    assert rows[1]["max_steps"] == 10 and rows[1]["samples_per_s"] > 0 and "time" in rows[0]


WORKER = """
import os, signal, sys
import torch.distributed as dist
from hpctrain import runtime

dist.init_process_group("gloo")
rank = dist.get_rank()
step = 0
while step < 50:
    step += 1
    if rank == 1 and step == 3:
        os.kill(os.getpid(), signal.SIGUSR2)   # only rank 1 is told
    if runtime.should_stop(wait=os.environ.get("WAIT", "1") == "1"):
        break
open(os.path.join(sys.argv[1], f"rank-{rank}"), "w").write(f"{step} {runtime.stop_reason()}")
runtime.exit(0)
"""


@pytest.mark.slow
@pytest.mark.lane
@pytest.mark.parametrize("wait", [True, False])
def test_should_stop_is_agreed_by_all_ranks(tmp_path, wait):
    (tmp_path / "worker.py").write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(tmp_path / "worker.py"),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**env, "OMP_NUM_THREADS": "1", "WAIT": "1" if wait else "0"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # wait=False: the vote started at step 3 is read at step 4, on both ranks alike
    at = 3 if wait else 4
    assert (tmp_path / "rank-1").read_text() == f"{at} SIGUSR2"
    assert (tmp_path / "rank-0").read_text() == f"{at} another rank"  # same step, told by rank 1
