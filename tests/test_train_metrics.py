"""Metrics, the nvidia-smi sampler (faked at the subprocess boundary) and the LR schedule."""

from __future__ import annotations

import json
import math
import os
import time

import pytest
import torch

from train_entry.config import load_config
from train_entry.metrics import GPU_QUERY, GpuSampler, Metrics
from train_entry.optim import lr_factor


def test_metrics_jsonl_and_train_log(tmp_path, capsys):
    m = Metrics(
        tmp_path,
        rank=0,
        max_steps=4,
        log_every=2,
        tensorboard=False,
        tokens_per_sample=16,
    )
    m.start(0)
    for step in range(1, 5):
        time.sleep(0.01)
        m.step(step, loss=3.0 - step * 0.1, lr=1e-3, samples=32, grad_norm=0.5)
    m.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4]
    r = rows[-1]
    assert r["loss"] == pytest.approx(2.6) and r["lr"] == 1e-3
    assert r["tokens_per_s"] == pytest.approx(16 * r["samples_per_s"])
    assert 0 < r["step_time_s"] < 5 and r["samples_per_s"] == pytest.approx(32 / r["step_time_s"])
    log = (tmp_path / "train.log").read_text()
    assert "step 4/4 loss 2.6000 lr 1.00e-03 samples/s" in log and "eta 0:00:00" in log
    assert "step 2/4" in capsys.readouterr().out  # not a terminal: plain lines on stdout too


def test_other_ranks_write_nothing(tmp_path):
    m = Metrics(
        tmp_path,
        rank=1,
        max_steps=2,
        log_every=1,
        tensorboard=False,
    )
    m.step(1, loss=1.0, lr=1.0, samples=1, grad_norm=1.0)
    m.line("hello")
    m.close()
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "train.log").exists()


def test_gpu_sampler_writes_csv(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    # prints what the real one prints for this query (header only with --format=csv)
    fake.write_text(
        '#!/bin/sh\necho "$1" >> "$(dirname "$0")/args"\n'
        'case "$2" in *noheader*) ;; *) echo "index, utilization.gpu [%], memory.used [MiB]";; esac\n'
        'echo "0, 97 %, 1000 MiB"\necho "1, 95 %, 1001 MiB"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    sampler = GpuSampler(tmp_path / "gpu.csv", every_s=0.05).start()
    csv, deadline = tmp_path / "gpu.csv", time.time() + 20
    while time.time() < deadline and (not csv.exists() or csv.read_text().count("\n") < 5):
        time.sleep(0.05)
    sampler.stop()
    lines = (tmp_path / "gpu.csv").read_text().splitlines()
    assert lines[0] == "time, index, utilization.gpu [%], memory.used [MiB]"
    assert lines[1].endswith(", 0, 97 %, 1000 MiB") and lines[2].endswith(", 1, 95 %, 1001 MiB")
    assert not any(line.startswith("time") for line in lines[1:])  # one header only
    assert (tmp_path / "bin" / "args").read_text().splitlines()[0] == f"--query-gpu={GPU_QUERY}"
    assert not GpuSampler.available(torch.device("cpu"))


@pytest.mark.parametrize(
    "decay, mid, end", [("cosine", 0.55, 0.1), ("linear", 0.55, 0.1), ("constant", 1.0, 1.0)]
)
def test_lr_schedule(decay, mid, end):
    cfg = load_config(
        None,
        [
            f"--schedule.decay={decay}",
            "--schedule.warmup_steps=4",
            "--schedule.min_lr_ratio=0.1",
            "--train.max_steps=104",
        ],
    )
    assert [lr_factor(s, cfg) for s in range(4)] == [0.2, 0.4, 0.6, 0.8]  # linear warmup
    assert lr_factor(4, cfg) == 1.0
    assert math.isclose(lr_factor(54, cfg), mid, rel_tol=1e-9)  # half way through decay
    assert math.isclose(lr_factor(104, cfg), end, rel_tol=1e-9)


def test_mfu_needs_a_known_device_and_counts_6n_plus_attention():
    import torch

    from train_entry import perf
    from train_entry.config import load_config

    assert perf.peak_flops(torch.device("cpu"), "bf16") is None  # a CPU has no agreed peak: no MFU
    cfg = load_config(None, [])
    m = cfg.model
    assert perf.flops_per_token(1000, cfg) == 6 * 1000 + 12 * m.n_layers * m.d_model * m.seq_len
    cfg = load_config(None, ["--model.factory=pkg.mod:build"])
    assert perf.flops_per_token(1000, cfg) == 6 * 1000  # a user model: 6N only
