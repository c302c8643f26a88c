"""torchrun's c10d rendezvous with its state signed by the job key (`--rdzv-backend=hpctrain`).

Why: the head agent's TCP store listens unauthenticated, its endpoint is on torchrun's command line,
and every agent unpickles the rendezvous state it keeps there about twice a second. Any account that
reaches the port could write that state and run code as the job's owner. Here the state is the
same c10d state, written as `HMAC(job key, run id, state) || state`; an agent refuses state whose
signature does not match before torch unpickles it, and the job fails with one line naming the
endpoint (an account that reaches the port can still disturb the job: docs/security.md).

    python -m hpctrain.launchers.rdzv TORCHRUN-ARGS...   torchrun, with this backend registered

A site's own torchrun finds the backend through the `torchrun.handlers` entry point (hpctrain
installed beside it). The key comes from the environment only (kernel/jobkey.py).

The handler is also where an agent leaves after a stop (`Guarded`): torchrun would open a new
rendezvous round to restart workers that left 75 after their save; the agent leaves before it
(kernel/fatal.launcher_leaves, docs/recovery.md).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    RendezvousBackend,
    Token,
    create_handler,
)

from hpctrain.kernel import fatal, jobenv, jobkey
from hpctrain.kernel.jobkey import RDZV_BACKEND as NAME

if TYPE_CHECKING:
    from collections.abc import Callable


class Signed(RendezvousBackend):
    """A c10d backend whose state carries an HMAC of the job key: nothing unsigned is returned."""

    def __init__(self, inner: RendezvousBackend, secret: bytes, run_id: str, endpoint: str):
        self._inner, self._secret, self._endpoint = inner, secret, endpoint
        self._run = run_id.encode()

    @property
    def name(self) -> str:
        return NAME

    def get_state(self) -> tuple[bytes, Token] | None:
        got = self._inner.get_state()
        return None if got is None else (self._open(got[0]), got[1])

    def set_state(
        self, state: bytes, token: Token | None = None
    ) -> tuple[bytes, Token, bool] | None:
        got = self._inner.set_state(jobkey.sign(self._secret, self._run, state) + state, token)
        if got is None:
            return None
        bits, token, mine = got
        return self._open(bits), token, mine

    def _open(self, bits: bytes) -> bytes:
        mac, state = bits[: jobkey.MAC_BYTES], bits[jobkey.MAC_BYTES :]
        if len(mac) < jobkey.MAC_BYTES or not jobkey.verify(self._secret, mac, self._run, state):
            raise RendezvousStateError(
                f"hpctrain: the rendezvous state in the store at {self._endpoint} is not signed by "
                "this job: another process wrote to the rendezvous port; refusing it unread "
                "(docs/security.md: isolate jobs' networks, or use launch.launcher: srun)"
            )
        return state


class Guarded(RendezvousHandler):
    """torchrun's handler, with one difference: after a stop (or an error that repeats) the agent
    leaves where it would start a new round (kernel/fatal.launcher_leaves says how), and it asks the
    store nothing more. Its workers are stopped by then (torchrun stops them before a round)."""

    def __init__(self, inner: RendezvousHandler) -> None:
        self._inner = inner
        self._rounds = 0

    def next_rendezvous(self) -> RendezvousInfo:
        self._rounds += 1
        if self._rounds > 1:  # the first round trains to its stop
            _leave_if_stopped()
        return self._inner.next_rendezvous()

    def num_nodes_waiting(self) -> int:
        """The agent asks this at every look at healthy workers: a store call to the head node,
        whose agent may be gone once a stop's checkpoint is committed. One stat of the STOP file
        per look (every 0.5 s) until a stop: the shared filesystem pays no more (issue 37)."""
        stop = jobenv.get(jobenv.STOP_FILE)
        stopped = bool(stop) and os.path.exists(stop or "") and _run_dir()
        if stopped and fatal.launcher_leaves(_run_dir()):
            return 0
        return self._inner.num_nodes_waiting()

    def get_backend(self) -> str:
        return self._inner.get_backend()

    @property
    def use_agent_store(self) -> bool:
        return self._inner.use_agent_store

    def is_closed(self) -> bool:
        return self._inner.is_closed()

    def set_closed(self) -> None:
        self._inner.set_closed()  # type: ignore[no-untyped-call]  # torch's, unannotated

    def get_run_id(self) -> str:
        return self._inner.get_run_id()

    def shutdown(self) -> bool:
        return self._inner.shutdown()


def _run_dir() -> str:
    return jobenv.get(jobenv.RUN_DIR) or ""


def _leave_if_stopped() -> None:
    """Leave this process now when launcher_leaves says so: one line, no traceback, no store call
    (os._exit: torchrun's handlers would report a failure and shut the rendezvous down)."""
    run_dir = _run_dir()
    leaves = fatal.launcher_leaves(run_dir) if run_dir else None
    if leaves is None:
        return
    code, line = leaves
    print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


def create(params: RendezvousParameters) -> RendezvousHandler:
    secret = jobkey.key()
    if secret is None:
        raise RendezvousStateError(
            f"hpctrain: --rdzv-backend={NAME} needs the job key in {jobenv.JOB_KEY}: start the "
            "job through hpctrain (its batch script sets it), or use --rdzv-backend=c10d"
        )
    backend, store = create_backend(params)
    signed = Signed(backend, secret, params.run_id, params.endpoint)
    return Guarded(create_handler(store, signed, params))


def handler() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The `torchrun.handlers` entry point: torch calls it for the creator it registers."""
    return create


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.run import main as torchrun  # lazy: torchrun's own argument parsing

    rendezvous_handler_registry.register(NAME, create)  # the entry point's, where it ran: the same
    torchrun(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    # the module's own copy, not __main__'s: the entry point registered that one's `create`
    from hpctrain.launchers.rdzv import main as run

    run()
