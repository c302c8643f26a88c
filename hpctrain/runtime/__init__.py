"""The runtime API for your own training script (`hpctrain submit --script train.py`).

    from hpctrain import runtime

    ckpt = runtime.Checkpoint()                  # <run folder>/checkpoints, train_entry's format
    found = ckpt.load()                          # the newest verified checkpoint, or None; after
    step = found.step if found else 0            # an in-job restart a newer snapshot in memory
    if found:
        model.load_state_dict(found.state["model"])
        optimizer.load_state_dict(found.state["optimizer"])

    def state():
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    while step < total:
        ...one optimizer step...
        step += 1
        ckpt.snapshot(step, state)               # every step; in memory when due (in-job restarts)
        stop = runtime.should_stop()             # the STOP file or a signal, agreed by all ranks
        if stop or step % save_every == 0 or step == total:
            ckpt.save(step, state())             # a kill without warning redoes one interval
        if stop:
            runtime.exit(runtime.PREEMPTED)      # 75: the batch shell requeues, the job resumes
    runtime.exit(0)                              # exit(0 or 75) frees the snapshots' memory

The whole recipe, as a script: examples/README.md (tests/scripts/recipe_ddp.py).

`should_stop()`, `run_dir()`, `restart_count()` and `exit()` need no torch; `Checkpoint` imports it
when it saves, loads or snapshots. Nothing here imports click. With torch.distributed initialised,
every rank must call `should_stop()` and `Checkpoint.save/load/snapshot` at the same point (they
are collectives).

A checkpoint is a `checkpoints/step-<8 digits>/` folder with a MANIFEST.json (every file with its
size and sha256) written last and a `checkpoints/latest` pointer, exactly like train_entry's, so
`hpctrain status`, `report` and `resume` read it the same way. Per rank, the RNG state (Python,
NumPy, torch CPU and CUDA) is saved and restored automatically; a data position is whatever you
put in the state dict (e.g. {"epoch": 1, "offset": 4096}).

A worker that dies is started again inside the job (`preemption.max_in_job_restarts`): the script
runs from the top and `load()` returns the newest snapshot every rank can get (its own node's
memory or its partner's copy on another node), when newer than the disk checkpoint, with the RNG
restored; so few steps are redone. Snapshots are taken every `Checkpoint(snapshot_every=N)` steps
(default: as often as they cost under 2% of a step; 0: never) and never replace `latest`. With
more than 2 DDP ranks, `runtime.fix_ddp_buckets(DDP(model))` keeps a resume exact (docs/recovery.md).

The modules: job.py (the run folder, the stop flag, exit, metrics), checkpoint.py (Checkpoint),
recovery.py (in-job restarts on a rank: snapshots, the partner exchange; shared with train_entry,
imports torch), frozen.py (a snapshot's bytes), restarts.py (the in_job_restart event).
"""

from __future__ import annotations

from hpctrain.runtime.checkpoint import (
    SAVES,
    STATE_FILE,
    Checkpoint,
    Found,
    _capture_rng,
    _restore_rng,
    _to_bytes,
)
from hpctrain.runtime.job import (
    ENV_RESTART_COUNT,
    ENV_RUN_DIR,
    ENV_STOP_FILE,
    PREEMPTED,
    STOP_SIGNALS,
    _dist,
    barrier,
    die_with_launcher,
    exit,
    fix_ddp_buckets,
    install,
    log_metrics,
    params_sha256,
    rank,
    restart_count,
    run_dir,
    should_stop,
    stop_reason,
)

__all__ = [
    "ENV_RESTART_COUNT",
    "ENV_RUN_DIR",
    "ENV_STOP_FILE",
    "PREEMPTED",
    "SAVES",
    "STATE_FILE",
    "STOP_SIGNALS",
    "Checkpoint",
    "Found",
    "_capture_rng",  # for hpctrain.integrations.lightning
    "_dist",
    "_restore_rng",
    "_to_bytes",
    "barrier",
    "die_with_launcher",
    "exit",
    "fix_ddp_buckets",
    "install",
    "log_metrics",
    "params_sha256",
    "rank",
    "restart_count",
    "run_dir",
    "should_stop",
    "stop_reason",
]
