"""Observability: rank-0 progress (rich bar on a terminal, plain lines otherwise and always in train.log),
metrics.jsonl, per-rank log files, GPU memory, an nvidia-smi sampler, TensorBoard, torch.profiler."""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import IO

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from torch.profiler import ProfilerActivity, profile, schedule

from hpctrain.kernel import layout
from hpctrain.kernel.rundir import RunFolder
from train_entry.trackers import Tracker, open_tracker

GPU_QUERY = "index,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu"


def rank_logger(run_dir: Path, rank: int) -> logging.Logger:
    """logs/rank-<R>.log, appended across restarts (the run folder is stable)."""
    log = logging.getLogger(f"train_entry.rank{rank}")
    log.setLevel(logging.INFO)
    log.propagate = False
    if not log.handlers:
        h = logging.StreamHandler(RunFolder(run_dir).open_log(layout.rank_log(rank)))
        h.handleError = lambda record: None  # type: ignore[method-assign]  # a full disk: no traceback
        h.setFormatter(logging.Formatter(f"%(asctime)s rank {rank} %(levelname)s %(message)s"))
        log.addHandler(h)
    return log


def _fmt_time(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Metrics:
    """Call `step(...)` after every optimizer step on every rank; rank 0 writes (GPU memory per rank
    comes with the step, from train_entry.stepsync)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        rank: int,
        max_steps: int,
        log_every: int,
        tensorboard: bool,
        tokens_per_sample: int | None = None,
        tracker: str = "none",
        tracker_project: str | None = None,
        config: Mapping[str, object] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.max_steps, self.log_every = max_steps, log_every
        self.tokens_per_sample = tokens_per_sample
        self.flops_per_token = 0.0  # set by the trainer with peak_flops (train_entry/perf.py)
        self.peak_flops: float | None = None  # of every device together; None: no MFU
        self.start(0)
        self.main = rank == 0
        self.log: IO[str] | None = None
        self.bar: Progress | None = None  # on a terminal (rank 0)
        self.tb: Tracker | None = None
        if not self.main:
            return
        self.folder = RunFolder(run_dir)
        self.log = self.folder.open_log(layout.TRAIN_LOG)
        if sys.stdout.isatty():
            self.bar = Progress(
                TextColumn("step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
            )
            self.task = self.bar.add_task("train", total=max_steps, completed=0, info="")
            self.bar.start()
        # The tracker opens at the first logged step, once the resume step is known.
        self.tracker_kind = "tensorboard" if tensorboard and tracker == "none" else tracker
        self.tracker_project, self.config = tracker_project, config or {}

    def start(self, step: int) -> None:
        """The loop starts (again) at `step`: rates and ETA count from here."""
        self.start_step = self.last_step = step
        self.t0 = self.last_t = time.perf_counter()
        bar = getattr(self, "bar", None)  # start() runs before __init__ sets it
        if bar is not None:
            bar.update(self.task, completed=step)

    def line(self, text: str) -> None:
        """A plain progress line: train.log always, stdout when there is no live bar."""
        if not self.main:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        assert self.log is not None  # rank 0 opened it
        self.log.write(f"{stamp} {text}\n")
        self.log.flush()
        if self.bar is None:
            print(text, flush=True)
        else:
            self.bar.console.print(text, markup=False, highlight=False)

    def step(
        self,
        step: int,
        *,
        loss: float,
        lr: float,
        samples: int,
        grad_norm: float,
        memory: Mapping[str, list[float]] | None = None,
        perf: float | None = None,
        wall: float | None = None,
    ) -> None:
        """`memory`, `perf` and `wall`: the GPU memory per rank and the step's completion times when
        the caller gathered them (train_entry.stepsync writes a step's line one step later)."""
        if step % self.log_every and step != self.max_steps:
            return
        mem = memory or {}
        if not self.main:
            return
        now = time.perf_counter() if perf is None else perf
        n = step - self.last_step
        dt = (now - self.last_t) / max(1, n)
        self.last_t, self.last_step = now, step
        rate = samples / dt if dt > 0 else 0.0
        eta = (now - self.t0) / max(1, step - self.start_step) * (self.max_steps - step)
        rec = {
            "step": step,
            "loss": loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "samples_per_s": rate,
            "step_time_s": dt,
            "max_steps": self.max_steps,
            "time": time.time() if wall is None else wall,
            **mem,
        }
        if self.tokens_per_sample:
            tokens = rec["tokens_per_s"] = rate * self.tokens_per_sample
            if self.peak_flops:  # all devices together: flops/token x tokens/s over the peak
                rec["mfu"] = tokens * self.flops_per_token / self.peak_flops
        self.folder.append(layout.METRICS, rec, sort_keys=False)
        tok = f" tok/s {rec['tokens_per_s']:.0f}" if "tokens_per_s" in rec else ""
        tok += f" mfu {rec['mfu']:.1%}" if "mfu" in rec else ""
        info = f"loss {loss:.4f} lr {lr:.2e} samples/s {rate:.1f}{tok} step {dt * 1000:.0f} ms"
        text = f"step {step}/{self.max_steps} {info} eta {_fmt_time(eta)}"
        assert self.log is not None  # rank 0 opened it
        self.log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
        self.log.flush()
        if self.bar is not None:
            self.bar.update(self.task, completed=step, info=info)
        else:
            print(text, flush=True)
        if self.tracker_kind != "none" and self.tb is None:
            self.tb = open_tracker(
                self.tracker_kind,
                self.run_dir,
                config=self.config,
                step=self.start_step,
                project=self.tracker_project,
            )
        if self.tb is not None:
            keys = (
                "loss",
                "lr",
                "samples_per_s",
                "grad_norm",
                "step_time_s",
                "tokens_per_s",
                "mfu",
            )
            self.tb.log(
                step, {k: float(v) for k in keys if isinstance(v := rec.get(k), (int, float))}
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self.log is not None:
            self.log.close()
        if self.tb is not None:
            self.tb.close()


class GpuSampler:
    """Every `every_s` seconds, one nvidia-smi CSV sample appended to <run>/gpu.csv (local rank 0)."""

    def __init__(self, path: Path, every_s: float = 10.0) -> None:
        self.path, self.every_s = path, every_s
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)

    @staticmethod
    def available(device: torch.device) -> bool:
        return device.type == "cuda" and shutil.which("nvidia-smi") is not None

    def start(self) -> GpuSampler:
        self.thread.start()
        return self

    def _run(self) -> None:
        header = not self.path.exists()
        with RunFolder(self.path.parent).open_log(self.path.name) as out:
            while not self.stop_event.is_set():
                fmt = "csv" if header else "csv,noheader"
                try:
                    res = subprocess.run(
                        ["nvidia-smi", f"--query-gpu={GPU_QUERY}", f"--format={fmt}"],
                        capture_output=True,
                        text=True,
                        timeout=30,
                    )
                except (OSError, subprocess.TimeoutExpired):
                    return
                if res.returncode == 0:
                    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
                    for i, row in enumerate(res.stdout.strip().splitlines()):
                        out.write(("time, " if header and i == 0 else f"{stamp}, ") + row + "\n")
                    out.flush()
                    header = False
                self.stop_event.wait(self.every_s)

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=5)


def profiler(
    run_dir: Path, rank: int, *, wait: int, warmup: int, active: int
) -> ContextManager[profile | None]:
    """torch.profiler over steps wait..wait+warmup+active; a Chrome trace per rank in <run>/profile/."""
    if active <= 0:
        return contextlib.nullcontext(None)
    out = run_dir / "profile"
    out.mkdir(parents=True, exist_ok=True)

    def export(prof: profile) -> None:
        prof.export_chrome_trace(str(out / f"rank-{rank}-step-{prof.step_num}.json"))

    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
    )
    return profile(
        activities=activities,
        schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
        on_trace_ready=export,
        record_shapes=False,
    )
