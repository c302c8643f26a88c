"""Hold a run's training processes still (SIGSTOP) while a test acts on it, so a preemption, a
requeue or a kill lands at the step the test chose, however loaded the machine is: under two CPU
hogs a `preempt` sent at step 3 of 30 once arrived after the last step (the run had COMPLETED)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hpctrain.kernel import jobenv


def ranks(run: Path) -> list[int]:
    """The run's training processes: torchrun's (or srun's) workers, which carry the run folder
    and a RANK in their environment; not torchrun, srun or the batch shell."""
    want = f"{jobenv.RUN_DIR}={run}".encode()
    me, out = os.getpid(), []
    for pid in os.listdir("/proc"):  # tests poll this: the command line first, the cheaper read
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if (
                not os.path.basename(cmd[0]).startswith(b"python")
                or b"torch.distributed.run" in cmd
                or b"hpctrain.launchers.rdzv" in cmd  # the torchrun agent
            ):
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if want in env and any(e.startswith(b"RANK=") for e in env):
            out.append(int(pid))
    return out


@contextmanager
def frozen(pids: list[int]) -> Iterator[None]:
    assert pids, "no training process to hold"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


@contextmanager
def held(run: Path) -> Iterator[None]:
    """Every rank of `run` stopped for the duration (the signals sent meanwhile wait for them)."""
    with frozen(ranks(run)):
        yield
