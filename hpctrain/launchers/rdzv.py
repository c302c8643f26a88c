"""torchrun's c10d rendezvous with its state signed by the job key (`--rdzv-backend=hpctrain`).

Why: the head agent's TCP store listens unauthenticated, its endpoint is on torchrun's command line,
and every agent unpickles the rendezvous state it keeps there (torch's, about once a second). Any
account that reaches the port could write that state and run code as the job's owner. Here the
state is the same c10d state, written as `HMAC(job key, run id, state) || state`; an agent refuses
state whose signature does not match before torch unpickles it, and the job fails with one line
naming the endpoint (an account that reaches the port can still disturb the job: docs/security.md).

    python -m hpctrain.launchers.rdzv TORCHRUN-ARGS...   torchrun, with this backend registered

A site's own torchrun finds the backend through the `torchrun.handlers` entry point (hpctrain
installed beside it). The key comes from the environment only (kernel/jobkey.py).

The handler is also where an agent leaves after a stop (`Guarded`): torchrun would open a new
rendezvous round to restart workers that left 75 after their save; the agent leaves before it
(kernel/fatal.launcher_leaves, docs/recovery.md).

At scale (issue 37) the handler is also quiet while training (`quiet`): torch's agents rewrite the
whole state (~115 B per node, 118 KiB at 1,024 nodes) every 5 s as their keep-alive, one
compare-and-set each, so ~N^2 bytes per interval through the head. Here an agent writes nothing
between rounds; its look for waiting nodes (every 0.5 s) reads an 8-byte count of the state's
writes (`Writes`), not the whole state, once nothing changed for a second; the join waits
`join_s(nodes)`, not torch's 600 s (Slurm starts every node at once, and --nnodes is min = max:
one missing node can only end in that timeout).
"""

from __future__ import annotations

import os
import sys
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    rendezvous_handler_registry,
)
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousBackend,
    Token,
    create_handler,
)

from hpctrain.kernel import fatal, jobenv, jobkey
from hpctrain.kernel.jobkey import RDZV_BACKEND as NAME

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.distributed.distributed_c10d import Store

# torch's private names this module uses (`quiet`, CACHE_S), the one place they are spelled (torch
# 2.7 to 2.14: kernel/support.py). tests/test_scale_rdzv.py fails naming the one a release moved.
PRIVATE = {
    "handler": ("_start_heartbeats", "_state_holder"),  # DynamicRendezvousHandler's
    "holder": ("_sanitize", "_cache_duration"),  # its _BackendRendezvousStateHolder's
}
WRITES_KEY = "hpctrain.rdzv.writes."  # + run id: the count of the state's writes (`Writes`)
CACHE_S = 1.0  # the state holder serves a state this old (_cache_duration, checked by the test)
STATE_FIELDS = ("complete", "participants", "last_heartbeats", "wait_list")  # _RendezvousState's
JOIN_BASE_S = 120  # every node's agent started by one srun, torch imported: well inside this
JOIN_PER_NODE_S = 0.1  # each joiner's compare-and-set queues at the head, the state ~115 B a node


class Signed(RendezvousBackend):
    """A c10d backend whose state carries an HMAC of the job key: nothing unsigned is returned."""

    def __init__(
        self,
        inner: RendezvousBackend,
        secret: bytes,
        run_id: str,
        endpoint: str,
        writes: Writes | None = None,
    ):
        self._inner, self._secret, self._endpoint = inner, secret, endpoint
        self._run, self._writes = run_id.encode(), writes

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
        if mine and self._writes is not None:
            self._writes.bump()  # after the state: a count seen means its state is readable
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


class Writes:
    """How many times the state was written, an 8-byte counter beside it in the store. torch's
    agent asks how many nodes wait at every look at its workers (every 0.5 s), and torch answers
    from the whole state, read at most once a second: ~N x 115 B per agent per second, N^2 at
    the head (65 MB/s at 1,024 nodes). While training nobody writes the state (`quiet`), so an
    unchanged count answers for it (issue 37)."""

    def __init__(self, store: Store, run_id: str) -> None:
        self._store, self._key = store, WRITES_KEY + run_id

    def bump(self) -> None:
        self._store.add(self._key, 1)

    def count(self) -> int:
        return int(self._store.add(self._key, 0))


class Guarded(RendezvousHandler):
    """torchrun's handler, with two differences: after a stop (or an error that repeats) the agent
    leaves where it would start a new round (kernel/fatal.launcher_leaves says how), and it asks the
    store nothing more (its workers are stopped by then: torchrun stops them before a round); and
    while the state's write count (`Writes`) holds still, a look for waiting nodes reads only it."""

    def __init__(self, inner: RendezvousHandler, writes: Writes | None = None) -> None:
        self._inner, self._writes = inner, writes
        self._rounds = 0
        self._seen = -1  # the write count of a state read that found nobody waiting
        self._looks: deque[tuple[float, int]] = deque(maxlen=8)  # (monotonic time, count)

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
        if self._writes is None:
            return self._inner.num_nodes_waiting()
        now, count = time.monotonic(), self._writes.count()
        if count == self._seen:
            return 0  # no write since a state read that found nobody waiting
        self._looks.append((now, count))
        waiting = self._inner.num_nodes_waiting()
        # that state may be cached, up to CACHE_S old: it holds every write counted before then
        older = [c for t, c in self._looks if t < now - CACHE_S - 0.1]
        if waiting == 0 and older:
            self._seen = older[-1]
        return waiting

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


def join_s(nodes: int) -> int:
    """The join timeout: how long agents wait for the last node of a round before they fail
    (torchrun's agent exits, the batch shell's gate, spares or requeue take over)."""
    return int(JOIN_BASE_S + JOIN_PER_NODE_S * nodes)


def quiet(handler: RendezvousHandler) -> RendezvousHandler:
    """torch's handler, silent between rounds: no keep-alive timer (each beat is a compare-and-set
    of the whole state), and a complete round's participants never expire by the age of their
    last beat. What torch uses the beats for: dropping a dead node before the next round. With
    --nnodes min = max that round cannot complete without the node anyway (the join timeout
    ends it, as before); a dead node while training is seen by Slurm and the stall watchdog, and
    an agent whose workers fail joins the wait list, which the others see at once (unchanged)."""
    if not isinstance(handler, DynamicRendezvousHandler):
        return handler
    handler._start_heartbeats = _no_beats  # type: ignore[method-assign]  # torch's, private
    # Any: torch's private state holder (PRIVATE["holder"]), reached through the handler
    holder: Any = handler._state_holder
    sanitize = getattr(holder, "_sanitize", None)
    if callable(sanitize):
        holder._sanitize = _keeping(holder, sanitize)
    return handler


def _no_beats() -> None:
    """Between rounds an agent writes nothing (this module's docstring)."""


def _keeping(holder: Any, sanitize: Callable[[], None]) -> Callable[[], None]:  # Any: as in quiet
    def run() -> None:
        state = holder.state
        beats = state.last_heartbeats
        kept = {n: beats.pop(n) for n in state.participants if n in beats} if state.complete else {}
        try:
            sanitize()  # drops what has no fresh beat: the wait list's, an incomplete round's
        finally:
            beats.update(kept)

    return run


def build(
    store: Store, inner: RendezvousBackend, params: RendezvousParameters, secret: bytes
) -> Guarded:
    """The handler over a c10d store and backend: signed, quiet, guarded, its join timeout set
    (a `join_timeout` in --rdzv-conf wins)."""
    if params.get("join_timeout") is None:
        params.config["join_timeout"] = join_s(params.max_nodes)
    writes = Writes(store, params.run_id)
    signed = Signed(inner, secret, params.run_id, params.endpoint, writes)
    return Guarded(quiet(create_handler(store, signed, params)), writes)


def create(params: RendezvousParameters) -> RendezvousHandler:
    secret = jobkey.key()
    if secret is None:
        raise RendezvousStateError(
            f"hpctrain: --rdzv-backend={NAME} needs the job key in {jobenv.JOB_KEY}: start the "
            "job through hpctrain (its batch script sets it), or use --rdzv-backend=c10d"
        )
    backend, store = create_backend(params)
    return build(store, backend, params, secret)


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
