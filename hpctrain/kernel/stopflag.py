"""The stop flag, torch-free: one implementation for train_entry (train_entry/preempt.py adds the
all-rank agreement over torch.distributed) and for user scripts (hpctrain/runtime/).

torchrun forwards only INT/TERM/HUP/QUIT to its workers, so Slurm's warning signal (USR2) reaches
the batch shell only; its trap touches the STOP_FILE (jobenv), which every rank polls at each step
boundary. A signal that does reach a rank (SIGTERM from torchrun, a direct kill -USR2) sets the
same flag. The handlers only set the flag: saving happens in the training loop, at a step
boundary, once every rank agreed. For tests and `hpctrain check-resume`, STOP_AT_STEP=N raises it
once N optimizer steps are done (`local(step)`, `reached(step)`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from pathlib import Path

from hpctrain.kernel import jobenv

DEFAULT_SIGNALS = ("SIGUSR2", "SIGUSR1", "SIGTERM")


def die_with_launcher() -> None:
    """Under torchrun, SIGKILL this worker when its torchrun dies.

    torchrun starts each worker in a session of its own, so when torchrun is killed outright (node
    loss, `hpctrain cancel` after its grace period, a local SIGKILL of the job's process group) the
    workers would train on as orphans and race a resumed job for the run folder. Linux only.
    """
    if not sys.platform.startswith("linux") or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # torchrun already died before the line above took effect
        os.kill(os.getpid(), signal.SIGKILL)


class StopFlag:
    """`install()` once per process (again is a no-op), then `local()` / `vote()` at every step
    boundary; the agreement between ranks is the caller's (one collective)."""

    def __init__(
        self,
        signals: tuple[str, ...] | list[str] = DEFAULT_SIGNALS,
        stop_file: str | os.PathLike[str] | None = None,
        stop_at_step: int | None = None,
    ) -> None:
        self.signals = tuple(s if s.startswith("SIG") else f"SIG{s}" for s in signals)
        self._stop_file = Path(stop_file) if stop_file else None
        env_step = jobenv.get(jobenv.STOP_AT_STEP)
        self.stop_at_step = (
            stop_at_step if stop_at_step is not None else (int(env_step) if env_step else None)
        )
        self.reason: str | None = None
        self.installed = False
        self._raised = False

    @property
    def stop_file(self) -> Path | None:
        """The file given, else the job environment's STOP_FILE (read at each look)."""
        if self._stop_file is not None:
            return self._stop_file
        env_file = jobenv.get(jobenv.STOP_FILE)
        return Path(env_file) if env_file else None

    def install(self) -> StopFlag:
        """Install the handlers (main thread only; elsewhere the flag file still works)."""
        if self.installed or threading.current_thread() is not threading.main_thread():
            return self
        self.installed = True
        die_with_launcher()
        for name in self.signals:
            signal.signal(getattr(signal, name), self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        # A handler must not save or do collectives: it may interrupt one. Set the flag only.
        self._raised = True
        self.reason = self.reason or signal.Signals(signum).name

    def raise_(self, reason: str) -> None:
        self._raised = True
        self.reason = self.reason or reason

    def local(self, step: int | None = None) -> bool:
        """This rank's view: a signal arrived, the flag file exists, or the test step is reached."""
        stop_file = self.stop_file if not self._raised else None
        if stop_file is not None and stop_file.exists():
            self.raise_(f"stop file {stop_file}")
        if (
            not self._raised
            and self.stop_at_step is not None
            and step is not None
            and step >= self.stop_at_step
        ):
            self.raise_(f"{jobenv.STOP_AT_STEP}={self.stop_at_step}")
        return self._raised

    def vote(self) -> bool:
        """This rank's own wish to stop (a signal or the flag file), to be agreed by all ranks
        (train_entry.stepsync carries it in the step's one collective)."""
        return self.local(None)

    def reached(self, step: int) -> bool:
        """STOP_AT_STEP reached: every rank has the same value and step, so it needs no agreement."""
        if self.stop_at_step is None or step < self.stop_at_step:
            return False
        self.raise_(f"{jobenv.STOP_AT_STEP}={self.stop_at_step}")
        return True
