"""Exit codes every process of a run agrees on: train_entry, the batch script, the CLI."""

from __future__ import annotations

OK = 0
FAILED = 1
USAGE = 2  # bad config or input: one message naming file:line: key and the fix
PREEMPTED = (
    75  # saved a verified checkpoint and stopped because the stop flag was raised (EX_TEMPFAIL)
)
TIMEOUT = 124  # the local executor's time limit (as timeout(1) reports it)
TERMINATED = 143  # 128 + SIGTERM: cancelled

MEANING: dict[int, str] = {
    OK: "finished",
    FAILED: "failed",
    USAGE: "bad config or input",
    PREEMPTED: "preempted: saved a verified checkpoint and stopped (a requeue or resume goes on)",
    TIMEOUT: "time limit (local executor)",
    TERMINATED: "cancelled (SIGTERM)",
}
