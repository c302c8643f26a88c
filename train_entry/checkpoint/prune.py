"""Pruning: the oldest step folders beyond `keep` go after a newer one is committed, renamed out of
the step-N namespace at once and deleted on a thread."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from hpctrain.kernel.checkpoint import prune


class Pruner:
    """Drops old step folders of `folder` (the checkpoints folder); `join()` waits for the delete."""

    def __init__(self, folder: Path, *, keep: int, log: Callable[[str], None]) -> None:
        self.folder, self.keep, self._log = folder, keep, log
        self._purging: threading.Thread | None = None  # deleting pruned folders

    def prune(self, newest: int) -> None:
        """Drop the oldest step folders beyond `keep`, only after a newer one was committed: each
        is renamed out of the step-N namespace now and deleted on a thread (`join()` waits)."""
        self.join()
        prune(self.folder, newest, self.keep, log=self._log, delete=self._purge_later)

    def join(self) -> None:
        purging, self._purging = self._purging, None
        if purging is not None:
            purging.join()

    def _purge_later(self, doomed: list[Path]) -> None:
        self._purging = threading.Thread(
            target=self._purge, args=(doomed,), daemon=True, name="hpctrain-prune"
        )
        self._purging.start()

    def _purge(self, doomed: list[Path]) -> None:
        for folder in doomed:
            try:
                shutil.rmtree(folder, ignore_errors=True)
            except BaseException as exc:  # noqa: BLE001 - a thread: say it, the next prune retries
                self._log(f"could not delete {folder.name} ({exc!r}); the next save retries")
