"""How a save fails: the failure every rank agrees on (SaveFailed, its kinds), and `attempt`, which
runs one step of a save and hands back its error. Imports no torch (the package's face)."""

from __future__ import annotations

import errno
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

LOW_SPACE = 64 << 20  # a save that failed with less free than this failed for lack of space
SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
# I/O faults that may pass by the next interval: a flaky or failing-over network filesystem
TRANSIENT_ERRNOS = {
    errno.EIO,
    errno.EAGAIN,
    errno.EINTR,
    errno.EBUSY,
    errno.ETIMEDOUT,
    errno.ESTALE,
    errno.ENOLCK,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ECOMM,
    errno.EREMOTEIO,
}
SPACE, TRANSIENT, FATAL = "space", "transient", "fatal"
# Every rank's (rank, (kind, text)) of its failure, or (rank, None): what SaveFailed takes.
Causes = list[tuple[int, tuple[str, str] | None]]


def _inner(exc: BaseException) -> list[BaseException]:
    """The rank failures inside DCP's CheckpointException (each an exception, or one with its
    traceback), else the exception itself."""
    if type(exc).__name__ != "CheckpointException":
        return [exc]
    out = []
    for item in (getattr(exc, "failures", None) or {}).values():
        item = item[0] if isinstance(item, tuple) and item else item
        if isinstance(item, BaseException):
            out.append(item)
    return out or [exc]


def classify(exc: BaseException, folder: Path | None = None) -> tuple[str, str]:
    """(kind, text) of a save's failure. kind: SPACE (ENOSPC/EDQUOT: free space, then the next
    interval saves), TRANSIENT (an I/O fault that may pass: the next interval tries again), FATAL
    (anything else: an ImportError, a TypeError, EACCES, ... fails the same way every time, so the
    run stops at once). text: one line, `Type: message`."""
    if isinstance(exc, SaveFailed):  # an async save's failure, raised again at wait()
        return exc.kind, exc.detail
    kinds = []
    for e in _inner(exc):
        code = getattr(e, "errno", None)
        said = str(e)
        if code in SPACE_ERRNOS or "No space left" in said or "Disk quota exceeded" in said:
            kinds.append((SPACE, e))
        elif isinstance(e, OSError) and code in TRANSIENT_ERRNOS:
            kinds.append((TRANSIENT, e))
        elif isinstance(e, (OSError, RuntimeError)) and folder is not None and _low(folder):
            # torch's zip writer (DeepSpeed's torch.save) hides ENOSPC: ask the disk
            kinds.append((SPACE, e))
        else:
            kinds.append((FATAL, e))
    rank = {FATAL: 0, SPACE: 1, TRANSIENT: 2}
    kind, e = min(kinds, key=lambda k: rank[k[0]])
    return kind, _line(e)


def _low(folder: Path) -> bool:
    try:
        return shutil.disk_usage(folder if folder.exists() else folder.parent).free < LOW_SPACE
    except OSError:
        return False


def _line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        where = f": {e.filename}" if e.filename else ""
        return f"{type(e).__name__}: [Errno {e.errno}] {e.strerror}{where}"
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300]}" if lines else type(e).__name__


class OtherRank(RuntimeError):
    """This rank stopped its part of a save because another rank failed (that one says why)."""


def cause_of(error: BaseException | None, folder: Path) -> tuple[str, str] | None:
    """What a rank tells the others about its failure (plain strings: exceptions may not pickle)."""
    return None if error is None or isinstance(error, OtherRank) else classify(error, folder)


class SaveFailed(Exception):
    """A checkpoint could not be written. Raised on EVERY rank at once (the ranks agree on it at
    each step of the save), with the same `kind` (common.classify) and `reason` on every rank:
    `causes` are every failed rank's (kind, text), gathered once the ranks agreed that one failed.
    SPACE and TRANSIENT failures let the run go on (the next interval saves again); FATAL stops it."""

    def __init__(
        self,
        step: int,
        folder: Path,
        cause: BaseException | None,
        causes: Causes | None = None,
    ) -> None:
        self.step, self.folder, self.cause = step, folder, cause
        if causes is None:  # one process: this rank's own error
            causes = [(0, cause_of(cause, folder))]
        found = [(r, c) for r, c in causes if c is not None]
        order = {FATAL: 0, SPACE: 1, TRANSIENT: 2}
        where = ""
        if found:
            rank, (self.kind, self.detail) = min(found, key=lambda rc: (order[rc[1][0]], rc[0]))
            where = "" if len(causes) == 1 else f" (rank {rank})"
        else:  # no rank said why (cannot happen when the ranks agree): not known to repeat
            self.kind, self.detail = TRANSIENT, "a rank failed without saying why"
        self.no_space = self.kind == SPACE
        # a full disk needs no exception name (torch may hide ENOSPC in a RuntimeError): the
        # exception's own line stays in `detail`, which the run's events.jsonl keeps
        self.reason = ("no space left on the device" if self.no_space else self.detail) + where
        super().__init__(f"checkpoint of step {step} into {folder} failed: {self.reason}")


def attempt(fn: Callable[[], object]) -> BaseException | None:
    """Run one step of a save on this rank: None, or the error it raised (for _agree, which makes
    every rank raise SaveFailed together: a rank that raised alone would leave the others waiting
    in the next collective). KeyboardInterrupt and SystemExit go on up."""
    try:
        fn()
    except Exception as exc:
        return exc
    except BaseException as exc:
        # DCP wraps each rank's failure in a CheckpointException (a BaseException, on every rank)
        if type(exc).__name__ == "CheckpointException":
            return exc
        raise
    return None


def stderr(msg: str) -> None:
    print(f"[hpctrain checkpoint] {msg}", file=sys.stderr, flush=True)
