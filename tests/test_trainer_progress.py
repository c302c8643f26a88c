"""Progress of an unchanged script from what its trainer writes (hpctrain/trainer_progress.py):
Trainer's trainer_state.json in the newest checkpoint of a folder the entry's arguments name, its
log lines (tqdm's bar, the loss dicts), Lightning's bar; the newer step wins and the source is named.
A callback's progress line without a loss still shows the loss of the line before."""

from __future__ import annotations

import json
import time

import yaml

from hpctrain.runs.progress import describe, snapshot


def _run(tmp_path, args):
    run = tmp_path / "runs" / "hf"
    (run / "logs").mkdir(parents=True)
    frozen = {"profile": {}, "request": {"args": args}, "cwd": str(tmp_path)}
    (run / "run.yaml").write_text(yaml.safe_dump(frozen))
    return run


def _state(folder, step, total, loss):
    ck = folder / f"checkpoint-{step}"
    ck.mkdir(parents=True)
    history = [{"step": step - 5, "loss": loss + 1}, {"step": step, "loss": loss}]
    state = {"global_step": step, "max_steps": total, "log_history": history}
    (ck / "trainer_state.json").write_text(json.dumps(state))


def test_nothing_written_yet_is_no_training_step(tmp_path):
    run = _run(tmp_path, ["out", "200"])
    assert snapshot(run) is None and describe(None) == "no training step yet"


def test_newest_trainer_checkpoint_of_a_relative_output_dir(tmp_path):
    run = _run(tmp_path, ["--output_dir", "out", "--steps", "200"])
    _state(tmp_path / "out", 50, 200, 2.5)
    _state(tmp_path / "out", 100, 200, 2.25)
    (tmp_path / "out" / "checkpoint-150").mkdir()  # half written: no trainer_state.json yet
    snap = snapshot(run)
    where = tmp_path / "out" / "checkpoint-100" / "trainer_state.json"
    assert (snap.step, snap.total, snap.loss) == (100, 200, 2.25)
    assert describe(snap) == f"step 100/200  loss 2.25  ETA ?  (from {where})"


def test_trainer_log_lines_are_newer_than_the_checkpoint(tmp_path):
    out = tmp_path / "abs-out"
    run = _run(tmp_path, [f"--output_dir={out}"])
    _state(out, 50, 200, 2.5)
    rank0 = run / "logs" / "torchrun" / "node-0" / "7_x" / "attempt_0" / "0"
    rank0.mkdir(parents=True)
    bar = "".join(f"\r {s}%|##   | {s}/200 [00:0{s % 10}<00:10, 10.00it/s]" for s in (60, 61, 62))
    (rank0 / "stderr.log").write_text(bar)
    dicts = "{'loss': '2.5', 'grad_norm': '1'}\n{'loss': '2.125', 'learning_rate': '0.001'}\n"
    (rank0 / "stdout.log").write_text(dicts)
    snap = snapshot(run)
    assert (snap.step, snap.total, snap.loss) == (62, 200, 2.125)
    assert abs(snap.step_time_s - 0.1) < 1e-9 and abs(snap.eta_s - 13.8) < 1e-6
    assert snap.source == f"{rank0 / 'stderr.log'} (log lines)"


def test_lightning_bar_with_its_loss(tmp_path):
    run = _run(tmp_path, [])
    bar = "\rEpoch 0:  45%|####5     | 90/200 [00:10<00:12,  2.00s/it, v_num=0, loss=1.75]"
    (run / "logs" / "rank-0.log").write_text(bar)
    snap = snapshot(run)
    assert (snap.step, snap.total, snap.loss, snap.step_time_s) == (90, 200, 1.75, 2.0)


def test_a_progress_line_without_loss_keeps_the_loss_before(tmp_path):
    now = time.time()
    rows = [
        {"step": 5, "loss": 2.5, "max_steps": 60, "samples_per_s": 100.0, "time": now},
        {"step": 7, "max_steps": 60, "step_time_s": 0.5, "time": now},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    snap = snapshot(tmp_path)
    assert (snap.step, snap.loss, snap.samples_per_s) == (7, 2.5, 100.0)
