"""Profile sections for node health: the preflight gate run inside each allocation, and the
timeouts and heartbeat that turn a dead peer or a hung rank into a requeue within minutes.

Imported by schema.py (which adds them to `Profile` as `preflight:` and `watchdog:`); their field
descriptions are what docs/site-profiles.md says. What each check does: docs/bad-nodes.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """Unknown keys are errors, as in every schema section (a typo is never silently ignored)."""

    model_config = ConfigDict(extra="forbid", validate_default=False)


class Preflight(Strict):
    """Quick checks on every node of the allocation before training starts (docs/bad-nodes.md)."""

    enabled: bool = Field(
        False, description="Run the gate at every start of the job (first start and each requeue)."
    )
    budget_s: int = Field(
        60,
        ge=5,
        le=3600,
        description="Seconds the whole gate may take; a node with no report by then fails.",
    )
    on_fail: Literal["shrink", "requeue"] = Field(
        "shrink",
        description="What a failed node causes: `shrink` continues at once on the healthy nodes "
        "when the request allows it (`submit --min-nodes`), else excludes the node and "
        "requeues; `requeue` always excludes the named nodes and requeues (Slurm then "
        "picks replacement nodes).",
    )
    slow_factor: float = Field(
        2.0,
        gt=1.0,
        description="A node whose matmul time is this many times the median of the other nodes "
        "(or whose every all-reduce pair is this many times slower than the median pair) "
        "is lagging, and fails.",
    )
    matmul_n: int = Field(
        1024,
        ge=64,
        le=16384,
        description="Size of the checked square matmul (float32; integer-valued inputs, so the "
        "product is exact and checked element by element).",
    )
    allreduce_mib: int = Field(
        16, ge=1, le=4096, description="Size of the all-reduce that measures bus bandwidth (MiB)."
    )
    expected_busbw_gbps: float | None = Field(
        None,
        gt=0,
        description="Bus bandwidth the site expects of the all-reduce between the nodes (GB/s, "
        "nccl-tests' definition); below `min_busbw_fraction` of it fails. Null: only "
        "compared between nodes.",
    )
    min_busbw_fraction: float = Field(
        0.5, gt=0, le=1, description="Fraction of `expected_busbw_gbps` that still passes."
    )


class Watchdog(Strict):
    """Timeouts that make a dead peer or a hung rank fail fast, and the stall heartbeat."""

    stall_s: int | None = Field(
        None,
        ge=10,
        description="A rank that completes no optimizer step for this many seconds is stalled: "
        "every rank dumps its stack into the run folder, the job stops and requeues. "
        "Null: off. Must exceed the longest step plus a checkpoint save.",
    )
    pg_timeout_s: int = Field(
        600,
        ge=10,
        description="Process-group timeout (seconds) for NCCL and gloo collectives, so a dead peer "
        "fails the job in minutes, not torch's default 30 (NCCL) minutes.",
    )
    nccl_async_error_handling: Literal[0, 1, 2, 3] = Field(
        3,
        description="TORCH_NCCL_ASYNC_ERROR_HANDLING: 3 tears the process down at a timed-out "
        "collective without cleanup (torch's own default), 1 with cleanup, 0 off.",
    )
    nccl_heartbeat_timeout_s: int = Field(
        600,
        ge=10,
        description="TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC: torch's NCCL watchdog kills a process whose "
        "watchdog thread is stuck this long.",
    )
