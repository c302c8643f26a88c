"""The stall heartbeat: a rank that completes no optimizer step for `watchdog.stall_s` s is stalled.

The trainer calls `beat(step)` after every step (and its checkpoint save). A daemon thread in every
rank watches its own beat: a rank hung in a collective, in I/O or in a sleeping peer's all-reduce
keeps that thread running (the GIL is released while waiting). When the beat is older than
stall_s, the thread dumps this rank's stack (py-spy when installed, else faulthandler) into
`stacks/<job>-<restart>/rank-<R>.txt`, the first rank to get there writes `STALLED` and a `stall`
event, and after a short grace (so the other ranks' dumps are written too) the rank exits with
STALL_EXIT. The batch shell sees STALLED and requeues; the run resumes from its newest checkpoint.

With the watchdog on, `heartbeat/rank-<R>.json` (step, time, pid, host) is rewritten every
5-30 s (stall_s / 3): what a person reads to find a rank's process.
"""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from hpctrain.kernel import jobenv, layout
from hpctrain.kernel.files import utc_now, write_atomic
from hpctrain.kernel.rundir import RunFolder

STALL_EXIT = 76
ENV_STALL_S = jobenv.STALL_S
ENV_PG_TIMEOUT_S = jobenv.PG_TIMEOUT_S
ENV_JOB_ID = jobenv.JOB_ID
ENV_RESTART_COUNT = jobenv.RESTART_COUNT
GRACE_S = 5.0
MARKER = layout.STALLED


def pg_timeout_min(default_min: float) -> float:
    """The process-group timeout: the profile's watchdog.pg_timeout_s inside an hpctrain job."""
    value = os.environ.get(ENV_PG_TIMEOUT_S)
    return float(value) / 60 if value else default_min


def _utc(t: float) -> str:
    return utc_now(t)


class Watchdog:
    """`start()` once, `beat(step)` after every step, `stop()` at the end."""

    def __init__(self, run_dir: Path, rank: int, stall_s: float | None = None) -> None:
        env = os.environ.get(ENV_STALL_S)
        self.stall_s = stall_s if stall_s is not None else (float(env) if env else None)
        self.run_dir, self.rank = Path(run_dir), rank
        self.step = -1
        self.last = 0.0  # monotonic time of the last beat; 0: not armed yet
        self.last_wall = 0.0
        self._written = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        tag = f"{os.environ.get(ENV_JOB_ID, 'local')}-{os.environ.get(ENV_RESTART_COUNT, '0')}"
        self.stacks = self.run_dir / layout.STACKS / tag
        self.heartbeat = self.run_dir / layout.HEARTBEAT / f"rank-{rank}.json"

    def start(self) -> Watchdog:
        if self.stall_s:
            self._thread = threading.Thread(
                target=self._watch, name="hpctrain-stall-watchdog", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def beat(self, step: int) -> None:
        now = time.monotonic()
        self.step, self.last, self.last_wall = step, now, time.time()
        # the file is for people (which process is rank R): rare writes, only with the watchdog on.
        # Never fsynced (durable=False): liveness is judged in memory by this thread, and a beat
        # lost to a node crash only loses a file the crash made stale anyway; the rename keeps it
        # whole (8,000 ranks writing every 30 s with an fsync each: ~270 forced flushes a second).
        if self.stall_s and now - self._written >= min(30.0, max(5.0, self.stall_s / 3)):
            self._written = now
            self.heartbeat.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(
                self.heartbeat,
                json.dumps(
                    {
                        "rank": self.rank,
                        "step": step,
                        "time": _utc(self.last_wall),
                        "pid": os.getpid(),
                        "host": socket.gethostname(),
                    }
                ),
                durable=False,
            )

    def _watch(self) -> None:
        assert self.stall_s
        while not self._stop.wait(1.0):
            if self.last and time.monotonic() - self.last > self.stall_s:
                self._fire()
                return

    def _fire(self) -> None:
        quiet = time.monotonic() - self.last
        self.stacks.mkdir(parents=True, exist_ok=True)
        dump = self.stacks / f"rank-{self.rank}.txt"
        with dump.open("w") as f:
            f.write(
                f"rank {self.rank} pid {os.getpid()} on {socket.gethostname()}: no step for "
                f"{quiet:.0f} s (watchdog.stall_s {self.stall_s:g}); last step {self.step}\n"
            )
            spy = shutil.which("py-spy")
            if spy:
                f.flush()
                try:
                    out = subprocess.run(
                        [spy, "dump", "--nonblocking", "--pid", str(os.getpid())],
                        capture_output=True,
                        text=True,
                        timeout=30,
                    )
                    f.write(out.stdout + out.stderr)
                except (OSError, subprocess.TimeoutExpired) as e:
                    f.write(f"py-spy failed: {e}\n")
            f.write("--- faulthandler (Python stacks of every thread) ---\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        try:
            fd = os.open(self.run_dir / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            fd = None
        if fd is not None:
            record = {
                "rank": self.rank,
                "host": socket.gethostname(),
                "last_step": self.step,
                "last_step_time": _utc(self.last_wall),
                "stall_s": self.stall_s,
                "stacks": str(self.stacks),
            }
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(record) + "\n")
            RunFolder(self.run_dir).event(
                "stall",
                job_id=os.environ.get(ENV_JOB_ID),
                restart_count=int(os.environ.get(ENV_RESTART_COUNT, "0") or 0),
                **record,
                source="train_entry",
            )
        time.sleep(GRACE_S)  # the other ranks' dumps, before torchrun and srun stop everything
        os._exit(STALL_EXIT)
