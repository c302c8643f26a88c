"""Is this process still the one a run started? Checked before any signal (cancel, preempt).

A pid in state.json can be reused once the run's script is gone (after a SIGKILL, say): signalling
it blindly could hit whatever holds it now. A process is the run's when all of these hold:
- /proc/<pid>/stat's start time (clock ticks since boot) is the one the script recorded;
- its command line is `bash <run folder>/job.sh <token>`, with this submission's token.
Anything else is not the run's process, and nothing is sent.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

# `hpctrain preempt --signal`: the signals the docs name (preemption.signal's choices, and TERM
# for a cancel rehearsal). Anything else (KILL, STOP, SEGV, a number) is refused.
PREEMPT_SIGNALS = ("USR2", "USR1", "HUP", "INT", "URG", "TERM")


def new_token() -> str:
    return secrets.token_hex(16)


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{int(pid)}/cmdline").read_bytes()
    except (OSError, ValueError):
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_run_script(pid: object, *, job_sh: Path, start: object, token: object) -> bool:
    """True only when `pid` is the run's batch script started at `start` with `token`."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return False
    if not isinstance(start, int) or not isinstance(token, str) or not token:
        return False
    if start_time(pid) != start:
        return False
    args = cmdline(pid)
    return (
        len(args) >= 3
        and os.path.basename(args[0]) == "bash"
        and args[1] == str(job_sh)
        and args[2] == token
    )


def is_run_controller(pid: object, *, submitit_dir: Path) -> bool:
    """True when `pid` is the local executor's controller for this run (a PENDING job)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return False
    args = cmdline(pid)
    return "submitit.local._local" in args and str(submitit_dir) in args
