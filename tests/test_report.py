"""hpctrain report on a run folder written the way train_entry and the batch script write it: one
restart that redid steps, saves, checkpoints, nvidia-smi samples; then two runs overlaid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

T0 = 1_800_000_000.0


def _run(root: Path, name: str, *, restart: bool) -> Path:
    run = root / "runs" / name
    (run / "logs").mkdir(parents=True)
    (run / "run.yaml").write_text(
        yaml.safe_dump(
            {
                "profile": {"scheduler": "local", "name": "local"},
                "request": {"name": name, "nodes": 2, "gpus": 1},
            }
        )
    )
    rows, t = [], T0
    steps = [*range(1, 13), *range(11, 21)] if restart else list(range(1, 21))
    for i, step in enumerate(steps):
        t += 30.0 if restart and i == 12 else 0.5  # the restart: 30 s without training
        rows.append(
            {
                "step": step,
                "loss": 3.0 - step * 0.05,
                "samples_per_s": 32.0,
                "step_time_s": 0.5,
                "max_steps": 20,
                "time": t,
                "mem_peak_gib": [1.0 + step / 100, 1.1],
            }
        )
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 2')
    starts = [{"time": "2027-01-15T08:00:00Z", "job_id": "7", "restart_count": 0, "host": "n1"}]
    if restart:
        starts.append(
            {"time": "2027-01-15T08:00:20Z", "job_id": "7", "restart_count": 1, "host": "n1"}
        )
    (run / "restarts.jsonl").write_text("".join(json.dumps(s) + "\n" for s in starts))
    (run / "jobs.jsonl").write_text(json.dumps({"job_id": "7", "kind": "submit"}) + "\n")
    (run / "events.jsonl").write_text(json.dumps({"time": T0 + 60, "event": "done"}) + "\n")
    (run / "saves.jsonl").write_text(
        "".join(json.dumps({"step": s, "blocked_s": 0.25, "time": T0 + s}) + "\n" for s in (10, 20))
    )
    for step in (10, 20):
        ck = run / "checkpoints" / f"step-{step:08d}"
        ck.mkdir(parents=True)
        (ck / "MANIFEST.json").write_text(
            json.dumps({"step": step, "time": "2027-01-15T08:01:00Z", "files": {}})
        )
    (run / "checkpoints" / "latest").write_text("step-00000020\n")
    (run / "gpu.csv").write_text(
        "time, index, utilization.gpu [%], memory.used [MiB], memory.total [MiB]\n"
        "2027-01-15T08:00:01, 0, 87 %, 1200 MiB, 81920 MiB\n"
        "2027-01-15T08:00:11, 0, 91 %, 1300 MiB, 81920 MiB\n"
    )
    return run


def hp(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, "-m", "hpctrain", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def test_report_summarises_a_restarted_run_and_writes_plots(tmp_path):
    run = _run(tmp_path, "a", restart=True)
    s = json.loads(hp(tmp_path, "report", "a", "--json").stdout)["runs"][0]
    assert s["steps"] == 20 and s["max_steps"] == 20 and s["restarts"] == 1
    assert s["steps_redone"] == 2 and s["restart_details"][0]["resumed_at"] == 10
    assert 29 <= s["restart_seconds_lost"] <= 30.5  # the gap, less one normal step
    assert s["save_seconds_blocked"] == 0.5 and s["saves"] == 2
    assert s["newest_checkpoint"]["step"] == 20
    assert s["gpu_hours_source"].startswith("estimate") and s["gpu_hours"] > 0
    assert s["loss_first"] == 2.95 and abs(s["loss_last"] - 2.0) < 1e-9

    out = hp(tmp_path, "report", "a").stdout
    assert "steps redone 2" in out and "restarts 1" in out
    for name in ("loss.png", "throughput.png", "step_time.png", "gpu.png"):
        png = run / "report" / name
        assert str(png) in out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.splitlines()[-1].strip() == f"loss curve: {run / 'report' / 'loss.png'}"


def test_report_overlays_two_runs(tmp_path):
    _run(tmp_path, "a", restart=True)
    _run(tmp_path, "b", restart=False)
    res = json.loads(hp(tmp_path, "report", "a", "b", "--json").stdout)
    assert [r["name"] for r in res["runs"]] == ["a", "b"]
    assert [r["restarts"] for r in res["runs"]] == [1, 0]
    folder = tmp_path / "runs" / "a" / "report" / "vs-b"
    assert str(folder / "loss.png") in res["plots"] and (folder / "loss.png").stat().st_size > 1000
