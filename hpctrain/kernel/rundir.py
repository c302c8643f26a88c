"""RunFolder: every write into a run folder goes through here (hpctrain.runs.folder.RunDir adds reading).

One atomic write (kernel/files.py), one JSON-lines appender, one event writer with one UTC clock.
The batch script writes its own events with the same fields and clock (hpctrain_event in the
template); train_entry, the runtime API for user scripts, the watchdog and the preflight gate use
`RunFolder(path).event(...)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

from hpctrain.kernel import layout
from hpctrain.kernel.files import append_jsonl, utc_now, write_atomic


class RunFolder:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).absolute()

    def file(self, rel: str) -> Path:
        """The path of `rel` (a hpctrain.kernel.layout name) inside the run folder."""
        return self.path / rel

    def write(
        self, rel: str, data: str | bytes, *, mode: int | None = None, durable: bool = True
    ) -> Path:
        """Replace the file `rel` atomically (readers see the old or the new file, never half)."""
        target = self.file(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, data, mode=mode, durable=durable)
        return target

    def append(self, rel: str, record: dict[str, Any], *, sort_keys: bool = True) -> None:
        """Append one JSON line to `rel` (jobs.jsonl, restarts.jsonl, metrics.jsonl...)."""
        target = self.file(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        append_jsonl(target, record, sort_keys=sort_keys)

    def open_log(self, rel: str) -> IO[str]:
        """A text handle appending to the log `rel` (train.log, logs/rank-R.log...): the one way
        to stream into a run folder file; lines are flushed by the caller."""
        target = self.file(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        return target.open("a")

    def event(self, event: str, **fields: Any) -> dict[str, Any]:  # Any: JSON fields of any type
        """One line of events.jsonl: {"time": <UTC>, "event": EVENT, **fields}; returns it."""
        record = {"time": utc_now(), "event": event, **fields}
        self.append(layout.EVENTS, record, sort_keys=False)
        return record
