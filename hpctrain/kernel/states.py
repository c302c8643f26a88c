"""Job states: the names a scheduler answers with (Slurm's, which the local script's mirror), and
the sets every reader decides by. The only place they are spelled."""

from __future__ import annotations

PENDING = "PENDING"
RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
PREEMPTED = "PREEMPTED"
TIMEOUT = "TIMEOUT"
NODE_FAIL = "NODE_FAIL"
OUT_OF_MEMORY = "OUT_OF_MEMORY"
BOOT_FAIL = "BOOT_FAIL"
DEADLINE = "DEADLINE"
REQUEUED = "REQUEUED"
UNKNOWN = "UNKNOWN"
LOST = "LOST"  # ours: the job ended without recording how (the local script killed, the node gone)
WAITING = "WAITING"  # ours: a sweep point never started

# Still in the queue or on nodes.
LIVE = frozenset({PENDING, RUNNING, REQUEUED, "RESIZING", "SUSPENDED", "CONFIGURING", "COMPLETING"})
# Nothing runs any more.
TERMINAL = frozenset(
    {COMPLETED, FAILED, CANCELLED, PREEMPTED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL}
    | {DEADLINE, LOST}
)
# Ended by a failure, not by a request or a limit.
FAILURES = frozenset({FAILED, LOST, NODE_FAIL, BOOT_FAIL, OUT_OF_MEMORY})
# Failures after which a run that never reached its first step may be submitted again by name.
FAILED_EARLY = FAILURES - {LOST}
# What `resume SWEEP` brings back: every end but success, and points never started.
RESUMABLE = (TERMINAL - {COMPLETED}) | {WAITING}
