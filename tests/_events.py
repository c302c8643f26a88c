"""A live run's events as the tests of the preemption and failure flow read them.

torchrun's c10d agent (with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which the batch shell sets) picks
the workers' store port by binding port 0 and closing it; rank 0 binds it again once spawned. On
this one machine every job's gloo listeners draw from the same ephemeral range, so now and then
another job takes that port first and rank 0 fails at its start with EADDRINUSE. The in-job
restart recovers it at once (seen in a fresh-clone run of test_sweep: down 0.0 s, nothing redone).
A restart that redid no step is not what these tests are about; any other one stays in."""

from __future__ import annotations

from typing import Any


def flow(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`events` without the in-job restarts that cost no step."""
    return [
        e
        for e in events
        if not (
            e["event"] == "in_job_restart"
            and e.get("steps_redone") == 0
            and e.get("reached_step") == e.get("resumed_step")
        )
    ]


def kinds(events: list[dict[str, Any]]) -> list[str]:
    """The names of `flow(events)`, in order."""
    return [e["event"] for e in flow(events)]
