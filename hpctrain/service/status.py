"""What `status` and `runs` show: one row per run, and one run in detail (reading only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain import dispatch
from hpctrain.kernel import layout
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.rundir import UnsafeRun
from hpctrain.runs import in_job, points, spares, sweepdir
from hpctrain.runs.cause import root_cause
from hpctrain.runs.folder import TERMINAL, BrokenRun, find_run
from hpctrain.runs.progress import health, snapshot

if TYPE_CHECKING:
    from hpctrain.runs.folder import RunDir


def summary(run: RunDir) -> dict[str, Any]:
    """One run's row; a run whose files cannot be read, or that another account could have
    written (a swapped folder: nothing in it is read), is a BROKEN row saying why (one broken
    folder never hides the others)."""
    try:
        return _read_summary(run)
    except (BrokenRun, UnsafeRun, OSError, ValueError, TypeError, AttributeError, KeyError) as e:
        why = (
            e.format_message()
            if isinstance(e, BrokenRun | UnsafeRun)
            else f"{type(e).__name__}: {e}"
        )
        return {
            "name": run.name,
            "state": "BROKEN",
            "job_id": None,
            "scheduler": None,
            "profile": None,
            "nodes": None,
            "gpus_per_node": None,
            "strategy": None,
            "mesh": None,
            "restarts": 0,
            "starts": 0,
            "checkpoint_step": None,
            "created": None,
            "path": str(run.path),
            "reason": why,
        }


def _read_summary(run: RunDir) -> dict[str, Any]:
    run.check_safe()
    frozen = run.frozen()
    req = frozen.get("request", {})
    restarts = run.restarts()
    state = dispatch.state(run)
    return {
        "name": run.name,
        "state": state,
        "job_id": run.last_job_id(),
        "scheduler": frozen.get("profile", {}).get("scheduler"),
        "profile": frozen.get("profile", {}).get("name"),
        "nodes": req.get("nodes"),
        "gpus_per_node": req.get("gpus"),
        # a user's own script or module has no strategy of ours: show its entry instead
        "strategy": req.get("strategy")
        if req.get("entry", {}).get("kind", "train_entry") == "train_entry"
        else req.get("entry", {}).get("kind"),
        # the layout of the newest start, as train_entry wrote it ("dp 2 x tp 2")
        "mesh": (layout.read_mesh(run.path) or {}).get("mesh"),
        "restarts": max(0, len(restarts) - len(run.jobs())) if restarts else 0,
        "starts": len(restarts),
        "checkpoint_step": run.newest_checkpoint_step(),
        "created": frozen.get("created"),
        "path": str(run.path),
        "reason": None,
    } | _reason(run, state)


def _reason(run: RunDir, state: str) -> dict[str, Any]:
    if state in ("FAILED", "LOST", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY"):
        return {"reason": run.failure_reason()}
    return {}


def detail(r: RunDir) -> dict[str, Any]:
    """summary() plus the start history, submissions, chain segments, training progress, the root
    cause of a failure and node health (preflight verdicts, stalls)."""
    info = summary(r)
    if info["state"] == "BROKEN":
        raise UserError(info["reason"])

    info["history"] = r.restarts()
    info["jobs"] = r.jobs()
    segments = []
    if r.scheduler() == "slurm":
        from hpctrain.dispatch.slurm import chain_states  # lazy: CLI start-up: Slurm runs only

        segments = chain_states(r)
    if segments:
        info["chain"] = segments
    info["progress"] = snapshot(r.path)
    failed = info["state"] not in ("COMPLETED", "RUNNING", "PENDING", "UNKNOWN", "REQUEUED")
    info["root_cause"] = cause = root_cause(r.path) if failed else None
    if cause is not None and not info.get("reason"):
        info["reason"] = cause["line"]  # the first line of `status`: which rank failed first, how
    events = r.events()
    info.update(health(events))
    info["in_job_restarts"] = in_job.summary(events)  # apart from requeues ("restarts")
    info["spares"] = spares.summary(
        events,
        asked=int(
            ((r.frozen().get("profile") or {}).get("preemption") or {}).get("spare_nodes") or 0
        )
        if info["scheduler"] == "slurm"
        else 0,
        newest_start=info["history"][-1] if info["history"] else None,
        verdict=_json(r.path / layout.PREFLIGHT_LATEST),
    )
    return info


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def cancel(ref: str, runs_dir: Path | None = None) -> dict[str, Any]:
    """Cancel a run's current job (or every point of a sweep). {"sweep": name, "points": [(point,
    state)]} or {"name", "before", "after"} (after None: it was not running)."""
    found = sweepdir.find(ref, runs_dir)
    if found is not None:
        return {"sweep": found.name, "points": points.cancel(found)}
    r = find_run(ref, runs_dir)
    before = dispatch.state(r)
    if before in TERMINAL:
        return {"name": r.name, "before": before, "after": None}
    return {"name": r.name, "before": before, "after": dispatch.cancel(r)}
