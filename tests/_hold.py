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
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        python = Path(cmd[0].decode(errors="replace")).name.startswith("python")
        if (
            python
            and want in env
            and any(e.startswith(b"RANK=") for e in env)
            and b"torch.distributed.run" not in cmd
            and b"hpctrain.launchers.rdzv" not in cmd  # the torchrun agent
        ):
            out.append(int(proc.name))
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
