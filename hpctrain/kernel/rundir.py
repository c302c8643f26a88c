"""RunFolder: every write into a run folder goes through here (hpctrain.runs.folder.RunDir adds reading).

One atomic write (kernel/files.py), one JSON-lines appender, one event writer with one UTC clock.
The batch script writes its own events with the same fields and clock (hpctrain_event in the
template); train_entry, the runtime API for user scripts, the watchdog and the preflight gate use
`RunFolder(path).event(...)`.

Modes (profile `storage.share`, docs/security.md): a run folder is 0700 (`none`) or 0750 (`group`),
and what is written into it follows the folder: a file is 0600 / 0640 (unless its writer names a
mode: job.sh), a folder 0700 / 0750, whatever the process's umask; the job itself runs under
`umask 077` / `027`.
`unsafe()` says why another account could have written the files `resume` and `status` trust.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from hpctrain.kernel import layout
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.files import append_jsonl, private_group, utc_now, write_atomic

# storage.share -> the umask of the job and of every write into its run folder
UMASK = {"none": 0o077, "group": 0o027}


def umask_of(share: str | None) -> int:
    return UMASK.get(share or "none", UMASK["none"])


def make_dirs(path: Path, mask: int, *, last_exists_ok: bool = True) -> None:
    """Create `path` and each missing folder above it, top down, each with mode 0777 & ~mask
    (setgid kept); folders that exist are left as they are."""
    missing = []
    p = Path(path)
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    if not missing and not last_exists_ok:
        raise FileExistsError(f"{path} exists")
    want = 0o777 & ~mask
    for p in reversed(missing):
        try:
            os.mkdir(p, want)
        except FileExistsError:
            if p == path and not last_exists_ok:
                raise
            continue  # made at the same moment by another process (a rank, the batch shell)
        mode = os.lstat(p).st_mode
        if mode & 0o777 != want:  # a stricter process umask: this folder's mode is the share's
            os.chmod(p, want | (mode & stat.S_ISGID))


class UnsafeRun(UserError):
    """A run folder, or a file in it that is trusted, that another account could have written."""


class RunFolder:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).absolute()
        self._mask: int | None = None

    def file(self, rel: str) -> Path:
        """The path of `rel` (a hpctrain.kernel.layout name) inside the run folder."""
        return self.path / rel

    def mask(self) -> int:
        """The umask of this run folder: 027 when its own mode lets the group in, else 077."""
        if self._mask is None:
            try:
                mode = os.stat(self.path).st_mode
            except OSError:
                return UMASK["none"]  # not made yet: private, and asked again next time
            self._mask = UMASK["group"] if mode & 0o050 else UMASK["none"]
        return self._mask

    def _parent(self, target: Path) -> None:
        if not target.parent.is_dir():
            make_dirs(target.parent, self.mask())

    def _create(self, target: Path) -> None:
        """Create `target` empty with the folder's mode unless it exists (appenders keep it)."""
        try:
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 & ~self.mask()))
        except FileExistsError:
            pass

    def write(
        self, rel: str, data: str | bytes, *, mode: int | None = None, durable: bool = True
    ) -> Path:
        """Replace the file `rel` atomically (readers see the old or the new file, never half);
        `mode` None: the folder's (0600 or 0640), whatever the process's umask."""
        target = self.file(rel)
        self._parent(target)
        mode = 0o666 & ~self.mask() if mode is None else mode
        write_atomic(target, data, mode=mode, durable=durable)
        return target

    def append(self, rel: str, record: Mapping[str, object], *, sort_keys: bool = True) -> None:
        """Append one JSON line to `rel` (jobs.jsonl, restarts.jsonl, metrics.jsonl...)."""
        target = self.file(rel)
        self._parent(target)
        self._create(target)
        append_jsonl(target, record, sort_keys=sort_keys)

    def open_log(self, rel: str) -> IO[str]:
        """A text handle appending to the log `rel` (train.log, logs/rank-R.log...): the one way
        to stream into a run folder file; lines are flushed by the caller."""
        target = self.file(rel)
        self._parent(target)
        self._create(target)
        return target.open("a")

    def event(self, event: str, **fields: object) -> dict[str, object]:
        """One line of events.jsonl: {"time": <UTC>, "event": EVENT, **fields}; returns it."""
        record = {"time": utc_now(), "event": event, **fields}
        self.append(layout.EVENTS, record, sort_keys=False)
        return record

    def unsafe(self) -> str | None:
        """Why another account could have written this run folder (a swap in a shared runs_dir) or
        the files `resume` and `status` trust (run.yaml, job.sh, state.json), as one line with the
        fix; None when only you (or root) could have."""
        me = os.geteuid()
        parent = self.path.parent
        try:
            up = os.stat(parent).st_mode
        except OSError:
            up = 0
        swap = ""
        if up & 0o022 and not up & stat.S_ISVTX:
            swap = (
                f"; {parent} is {_who(up)}-writable without the sticky bit, so others can swap "
                f"run folders there: `chmod +t {parent}`"
            )
        for rel, kind in (("", "folder"), *((f, "file") for f in layout.TRUSTED)):
            path = self.path / rel if rel else self.path
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # missing files are the readers' concern (a BROKEN run, or no state yet)
            except OSError as e:
                return f"{path} cannot be checked ({e.strerror}); fix: check its folder's mode"
            if stat.S_ISLNK(st.st_mode):
                return (
                    f"{path} is a symlink where a {kind} is expected (anyone who could write its "
                    f"target could change what runs); fix: move the run folder away{swap}"
                )
            is_kind = stat.S_ISDIR(st.st_mode) if kind == "folder" else stat.S_ISREG(st.st_mode)
            if not is_kind:
                return f"{path} is not a {kind}; fix: move the run folder away{swap}"
            if st.st_uid not in (me, 0):
                return (
                    f"{path} is owned by uid {st.st_uid}, not you (uid {me}): this run folder is "
                    f"not yours (another account may have put it there); fix: move it away{swap}"
                )
            if st.st_mode & 0o002 or (st.st_mode & 0o020 and not private_group(st.st_gid, me)):
                return (
                    f"{path} is {_who(st.st_mode)}-writable (mode {st.st_mode & 0o7777:04o}): "
                    f"another account could change it; fix: `chmod go-w {path}` (then check "
                    f"that its content is yours){swap}"
                )
        return None

    def check_safe(self) -> None:
        """UnsafeRun (exit 2, one line) unless only you (or root) could have written the run."""
        why = self.unsafe()
        if why is not None:
            raise UnsafeRun(f"run folder not safe to use: {why}")


def _who(mode: int) -> str:
    return "/".join(w for w, bit in (("group", 0o020), ("other", 0o002)) if mode & bit)
