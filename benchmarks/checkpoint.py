"""2. Checkpoint save and load: train_entry's Checkpointer against raw I/O of the same bytes.

One torchrun job (2 ranks, gloo, DDP, the demo GPT; benchmarks/workers/ckpt.py) interleaves, per
repetition: a sync save; rank 0's raw sequential write + fsync of the same number of bytes into the
same folder (benchmarks/baselines/raw_write.py); an async save followed by training steps; a load.
The first repetition is a warm-up (first-save planning, the async save's process group) and is
dropped. Figures:
  - save bandwidth: bytes/s of a sync save over bytes/s of the raw write+fsync (>= 0.5);
  - async blocking: training time the loop spends blocked by an async save (the save call plus any
    wait for it afterwards) over the time of a sync save (<= 0.1); the step slowdown while the
    background write runs is reported beside it (noisy on a shared machine);
  - load: seconds to verify and load the newest checkpoint, over a raw read of the same bytes
    (stated as measured; no target).
"""

from __future__ import annotations

import json

from benchmarks import common
from benchmarks.training import TRAIN_ARGS


def run(quick: bool) -> list[dict]:
    reps, steps = (5, 5) if quick else (8, 5)
    reps = max(2, common.reps(reps))  # the first one is a warm-up
    names = ("checkpoint_save_vs_raw_write", "checkpoint_async_blocked_vs_sync",
             "checkpoint_load_vs_raw_read")
    targets = (">= 0.5", "<= 0.1", "-")
    run_dir = common.scratch("ckpt-")
    out = run_dir.parent / f"{run_dir.name}.json"
    try:
        common.run([*common.torchrun(2), str(common.BENCH / "workers" / "ckpt.py"),
                    "--run-dir", str(run_dir), "--reps", str(reps), "--steps", str(steps),
                    "--out", str(out)], timeout=900, BENCH_TRAIN_ARGS=json.dumps(TRAIN_ARGS))
        data = json.loads(out.read_text())
    except common.NotMeasured as e:
        return [common.not_measured(n, t, str(e)) for n, t in zip(names, targets)]

    r = data["reps"][1:]  # the first repetition is a warm-up
    m = {k: common.median([x[k] for x in r]) for k in r[0]}
    setup = {"train_args": TRAIN_ARGS, "strategy": "ddp", "processes": 2, "reps_used": len(r),
             "warmup_reps_dropped": 1, "reps": data["reps"]}
    save_bw, raw_bw = m["bytes"] / m["sync_save_s"], m["bytes"] / m["raw_write_s"]
    blocked = m["async_call_blocked_s"] + m["async_wait_after_steps_s"]
    slowdown = max(0.0, m["async_save_plus_steps_s"] - m["plain_steps_s"])
    mb = m["bytes"] / 1e6
    return [
        common.measured(names[0], save_bw / raw_bw, targets[0], **setup,
                        summary=f"sync save of {mb:.1f} MB: {save_bw / 1e6:.0f} MB/s "
                                f"({m['sync_save_s']:.3f} s); raw write+fsync {raw_bw / 1e6:.0f} MB/s "
                                f"({m['raw_write_s']:.3f} s)"),
        common.measured(names[1], blocked / m["sync_save_s"], targets[1], **setup,
                        async_step_slowdown_s=slowdown,
                        summary=f"async save blocks the loop {blocked:.3f} s (call "
                                f"{m['async_call_blocked_s']:.3f} s + wait "
                                f"{m['async_wait_after_steps_s']:.3f} s) vs a sync save "
                                f"{m['sync_save_s']:.3f} s; {steps} steps during the background "
                                f"write took {slowdown:.3f} s longer than without"),
        common.result(names[2], m["load_s"] / m["raw_read_s"], targets[2], None, **setup,
                      load_s=m["load_s"],
                      summary=f"load (verify checksums + DCP load, 2 ranks) of {mb:.1f} MB: "
                              f"{m['load_s']:.3f} s; raw read of the same bytes "
                              f"{m['raw_read_s']:.3f} s (page cache warm)"),
    ]
