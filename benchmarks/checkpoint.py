"""2. Checkpoint save and load: train_entry's Checkpointer against raw I/O of the same bytes.

One torchrun job (2 ranks, gloo, DDP, the demo GPT; benchmarks/workers/ckpt.py) interleaves, per
repetition: a sync save; rank 0's raw sequential write + fsync of the same number of bytes into the
same folder (benchmarks/baselines/raw_write.py); an async save followed by training steps; a load.
The first repetition is a warm-up (first-save planning, the async save's process group) and is
dropped. Figures:
  - save bandwidth: bytes/s of a sync save (the slowest rank's time from a common start) over
    bytes/s of the raw write+fsync (>= 0.5); before each, the journal is committed so that neither
    pays for the previous prune's deletes; rank 0's phases are in the details;
  - async blocking: training time the loop spends blocked by an async save (the save call, the next
    optimizer step's wait for the staging copy and the wait for the save afterwards; each rank's
    own time, the slowest rank's taken) over the time of a sync save (<= 0.1);
  - steps/s during a background save vs none: K steps with no save over the same K steps right
    after an async save call (stated; noisy on a shared machine);
  - load: seconds to verify and load the newest checkpoint, over a raw read of the same bytes
    (stated as measured; no target).
"""

from __future__ import annotations

import json

from benchmarks import common
from benchmarks.training import TRAIN_ARGS


def run(quick: bool) -> list[common.Row]:
    reps, steps = (4, 5) if quick else (6, 5)
    reps = max(2, common.reps(reps))  # the first one is a warm-up
    names = (
        "checkpoint_save_vs_raw_write",
        "checkpoint_async_blocked_vs_sync",
        "checkpoint_steps_per_s_during_async_save_vs_none",
        "checkpoint_load_vs_raw_read",
    )
    targets = (">= 0.5", "<= 0.1", "-", "-")
    run_dir = common.scratch("ckpt-")
    out = run_dir.parent / f"{run_dir.name}.json"
    try:
        common.run(
            [
                *common.torchrun(2),
                str(common.BENCH / "workers" / "ckpt.py"),
                "--run-dir",
                str(run_dir),
                "--reps",
                str(reps),
                "--steps",
                str(steps),
                "--out",
                str(out),
            ],
            timeout=900,
            extra_env={"BENCH_TRAIN_ARGS": json.dumps(TRAIN_ARGS)},
        )
        data = json.loads(out.read_text())
    except common.NotMeasured as e:
        return [common.not_measured(n, t, str(e)) for n, t in zip(names, targets, strict=True)]

    r = data["reps"][1:]  # the first repetition is a warm-up
    m = {k: common.median([x[k] for x in r]) for k in r[0] if isinstance(r[0][k], (int, float))}
    setup = {
        "train_args": TRAIN_ARGS,
        "strategy": "ddp",
        "processes": 2,
        "reps_used": len(r),
        "warmup_reps_dropped": 1,
        "reps": data["reps"],
    }
    save_bw, raw_bw = m["bytes"] / m["sync_save_s"], m["bytes"] / m["raw_write_s"]
    blocked = [
        x.get("async_blocked_s")
        or x["async_call_blocked_s"]
        + x.get("async_hook_wait_s", 0.0)
        + x["async_wait_after_steps_s"]
        for x in r
    ]
    mb = m["bytes"] / 1e6
    phases = {
        k: common.median([x["sync_phases"].get(k, 0.0) for x in r])
        for k in r[0].get("sync_phases", {})
    }
    breakdown = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in phases.items())
    return [
        common.settle(
            names[0],
            [x["raw_write_s"] / x["sync_save_s"] for x in r],
            targets[0],
            **setup,
            sync_phases_median_s=phases,
            summary=f"sync save of {mb:.1f} MB: {save_bw / 1e6:.0f} MB/s "
            f"({m['sync_save_s']:.3f} s); raw write+fsync {raw_bw / 1e6:.0f} MB/s "
            f"({m['raw_write_s']:.3f} s)" + (f"; rank 0: {breakdown}" if breakdown else ""),
        ),
        common.settle(
            names[1],
            [b / x["sync_save_s"] for b, x in zip(blocked, r, strict=True)],
            targets[1],
            **setup,
            summary=f"async save blocks the loop {common.median(blocked):.4f} s (call "
            f"{m['async_call_blocked_s']:.4f} s + the next optimizer step "
            f"waiting for the staging copy {m.get('async_hook_wait_s', 0):.4f} s "
            f"+ wait {m['async_wait_after_steps_s']:.4f} s) vs a sync save "
            f"{m['sync_save_s']:.3f} s",
        ),
        common.result(
            names[2],
            common.median([x["plain_steps_s"] / x["async_save_plus_steps_s"] for x in r]),
            targets[2],
            None,
            spread=common.spread_of([x["plain_steps_s"] / x["async_save_plus_steps_s"] for x in r]),
            **setup,
            summary=f"{steps} steps while the background write runs: "
            f"{m['async_save_plus_steps_s']:.3f} s (the save call included); "
            f"the same steps with no save {m['plain_steps_s']:.3f} s",
        ),
        common.result(
            names[3],
            m["load_s"] / m["raw_read_s"],
            targets[3],
            None,
            **setup,
            load_s=m["load_s"],
            summary=f"load (verify checksums + DCP load, 2 ranks) of {mb:.1f} MB: "
            f"{m['load_s']:.3f} s; raw read of the same bytes "
            f"{m['raw_read_s']:.3f} s (page cache warm)",
        ),
    ]
