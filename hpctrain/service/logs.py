"""Which log files to show for a run, and following them while the job runs (reading only).

A routine preemption (a rank saved and left 75, the job requeued) makes the launcher say much that
reads like a crash: torchrun's `failed (exitcode: 75)`, its shutdown traceback, c10d's C++ warnings
and frames, srun's step-kill lines. What is shown (`Quiet`) leaves those out, from the stop's exit
to the next start, and says how many lines it left out; the files themselves keep everything.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain import dispatch
from hpctrain.kernel import layout
from hpctrain.kernel.errors import UserError
from hpctrain.runs.folder import TERMINAL

if TYPE_CHECKING:
    from hpctrain.runs.folder import RunDir


def log_files(run: RunDir, *, rank: int | None, node: int | None, follow: bool) -> list[Path]:
    """logs/batch.log and every node log; or one rank's (train_entry's own file, else torchrun's
    --tee files of a user script); or one node's."""
    if rank is not None and node is not None:
        raise UserError("give --rank or --node, not both")
    if rank is not None:
        files = [run.path / layout.rank_log(rank)]
        if not files[0].is_file():
            files = _torchrun_rank_logs(run, rank) or files
    elif node is not None:
        files = [run.path / layout.node_log(node)]
    else:
        files = [run.path / layout.BATCH_LOG, *sorted(run.logs.glob("node-*.log"))]
    missing = [f for f in files if not f.is_file()]
    if (rank is not None or node is not None) and missing and not follow:
        have = ", ".join(sorted(p.name for p in run.logs.glob("*.log"))) or "none yet"
        raise UserError(f"{missing[0]} does not exist (logs of {run.name}: {have})")
    return files


def _torchrun_rank_logs(run: RunDir, rank: int) -> list[Path]:
    """A user script's rank output: torchrun's --tee files, logs/torchrun/node-N/<id>/attempt_K/<local>/."""
    gpus = run.record().gpus or 1
    node, local = divmod(rank, gpus)
    found = (run.logs / "torchrun" / f"node-{node}").glob(f"*/attempt_*/{local}/std*.log")
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))


def follow(
    run: RunDir, files: list[Path], out: Callable[[str], None], *, new_nodes: bool = False
) -> None:
    """Pass what is added to `files` to `out` until the job ends; `new_nodes`: node logs that appear
    later (the job was pending when following began) are followed too. Ctrl-C stops quietly.
    The scheduler is asked on dispatch.Poll's schedule (Slurm: backing off to once a minute, sooner
    when the run folder's own files change); the logs folder is listed again only when its mtime
    changes (a new file), and a file is read only when it grew."""
    offsets = {f: 0 for f in files}
    quiet = {f: Quiet(f) for f in files}
    poll = dispatch.poll_for(run, None)
    listed: int | None = None
    last, ended = "", False
    try:
        while True:
            if new_nodes and (stamp := _mtime(run.logs)) != listed:
                listed = stamp
                for f in sorted(run.logs.glob("node-*.log")):
                    offsets.setdefault(f, 0)
                    quiet.setdefault(f, Quiet(f))
            for f in list(offsets):
                text = _grown(f, offsets, quiet[f])
                if text:
                    out(text)
            if ended:  # one last read after the end
                for q in quiet.values():
                    if text := q.end():
                        out(text)
                return
            now = time.monotonic()
            if poll.due(now):
                current = dispatch.state(run)
                poll.answered(now, changed=current != last)
                last, ended = current, current in TERMINAL
            time.sleep(1)
    except KeyboardInterrupt:
        return


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _grown(f: Path, offsets: dict[Path, int], quiet: Quiet) -> str:
    """What was added to `f` since the last read, shown quietly ("" when it did not grow)."""
    try:
        if f.stat().st_size <= offsets[f]:
            return ""
        with f.open("rb") as fh:
            fh.seek(offsets[f])
            chunk = fh.read()
    except OSError:
        return ""
    offsets[f] += len(chunk)
    return quiet.feed(chunk.decode(errors="replace"))


# ---------------------------------------------------------------- a routine preempt, shown quietly
_START = re.compile(r"^hpctrain: (node \d+ (task \d+ )?.*on |start of job )")
_STOPPED = re.compile(  # from here to the next start, the launcher's exit is routine
    r"failed \(exitcode: 75\)|^hpctrain: a rank left 75 after the stop's checkpoint"
    r"|^hpctrain: the stop's checkpoint is committed|^hpctrain: a stop was asked: this node"
)
_NOISE = re.compile(
    r"failed \(exitcode: 75\)"  # torchrun: a worker left 75
    r"|^[EWI]\d{4} [\d:.]+ +\d+ \S*torch/distributed/"  # torch's Python log lines
    r"|^\[[EWI]\d{4} "  # c10d's C++ log lines ([W1206 22:57:32.38 socket.cpp:469] ...)
    r"|^frame #\d+: |^Exception raised from |^terminate called"  # C++ frames
    r"|^\[default\d+\]:hpctrain: not started again: a stop was asked"
    r"|^srun: |^slurmstepd\S*: error: \*\*\* "  # srun ending the step
)
_RULE = re.compile(r"^={20,}$")  # torchrun's failure summary is framed by these
_CHAIN = re.compile(r"^(During handling of the above exception|The above exception was the direct)")


class Quiet:
    """Lines in, the lines to show out: a routine preempt's launcher noise left out (above)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stopped = False  # inside a job start's routine exit
        self.hidden = 0
        self.block: str | None = None  # inside a hidden traceback or summary
        self.rest = ""

    def feed(self, text: str) -> str:
        """Complete lines of `text` (and what was left over before) filtered; a partial last line
        waits for the next feed."""
        lines = (self.rest + text).split("\n")
        self.rest = lines.pop()
        return "".join(self._line(line) for line in lines)

    def end(self) -> str:
        """The partial last line, and the count of lines left out."""
        out = self._line(self.rest)[:-1] if self.rest else ""
        self.rest = ""
        return out + self._summary()

    def _summary(self) -> str:
        if not self.hidden:
            return ""
        n, self.hidden = self.hidden, 0
        return (
            f"hpctrain logs: {n} line(s) of the launcher's exit after a routine preempt not shown "
            f"(exit 75, shutdown); {self.path} has them\n"
        )

    def _line(self, line: str) -> str:
        if _START.match(line):
            head = self._summary()
            self.stopped, self.block = False, None
            return head + line + "\n"
        if not self.stopped and _STOPPED.search(line):
            self.stopped = True
        if self.stopped and self._noise(line):
            self.hidden += 1
            return ""
        return line + "\n"

    def _noise(self, line: str) -> bool:
        if self.block == "traceback":
            if line[:1] in (" ", "\t"):
                return True
            self.block = "chain"  # the exception's own line ends the block
            return True
        if self.block == "chain" and (not line or _CHAIN.match(line)):
            return True  # a chained exception: its traceback follows
        if self.block == "summary":
            if _RULE.match(line):
                self.block = None
            return True
        self.block = None
        if line.startswith("Traceback (most recent call last):"):
            self.block = "traceback"
            return True
        if _RULE.match(line):
            self.block = "summary"
            return True
        return bool(_NOISE.search(line))


def shown(path: Path) -> str:
    """A log file as `hpctrain logs` shows it (Quiet)."""
    quiet = Quiet(path)
    return quiet.feed(path.read_text(errors="replace")) + quiet.end()
