"""2. Checkpoint save and load: train_entry's Checkpointer against raw I/O of the same bytes.

Two torchrun jobs (2 ranks, gloo, DDP, the demo GPT; benchmarks/workers/ckpt.py has what each
repetition does). The first repetition of each is a warm-up (first-save planning, the async save's
process group, the first load's imports) and is dropped; the big state's first four are (a run's
first big saves write slower, see `run`).
  - The demo state (TRAIN_ARGS, 38 MB): an async save followed by training steps, a sync save
    beside a raw write; gives the async rows:
    - async blocking: training time the loop spends blocked by an async save (the save call, the
      next optimizer step's wait for the staging copy and the wait for the save afterwards; each
      rank's own time, the slowest rank's taken) over the time of a sync save (<= 0.1);
    - steps/s during a background save vs none: K steps with no save over the same K steps right
      after an async save call (stated; noisy on a shared machine).
  - The state of STATE_ARGS (d_model 1024, 8 layers: 1.21 GB of weights and AdamW moments, each
    rank writing half; BENCH_CKPT_ARGS, a JSON list, overrides it), where fixed costs no longer
    dominate, no training between repetitions:
    - save bandwidth: bytes/s of a sync save (each rank's own time from a common start, the
      slowest rank's) over bytes/s of the raw write of the same bytes with the same fsync
      discipline (each rank writes as many random bytes as its files of the save hold, in 8 MiB
      writes, fsyncs its file and the folder; the same start and slowest rank), one after the
      other, each after deleting what the same kind of write left (>= 0.9); rank 0's phases are
      in the details;
    - load, after the last save: seconds to verify (every digest of what each rank reads) and
      load the newest checkpoint into the live state, over a raw read of the same bytes into
      memory allocated before, as a load's tensors are (each rank reads every file of the
      checkpoint, as each DDP rank's load does, with plain 8 MiB read() calls), both with a cold
      page cache (every file's pages dropped with posix_fadvise before each: a restart that
      reads from the disk), in turns (<= 1.5). In the details, stated: the same with the page
      cache warm, and both against reads that drop each 8 MiB chunk (no memory written).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from benchmarks import common
from benchmarks.training import TRAIN_ARGS

# the save and load rows' state: fixed costs (planning, the manifest, fsyncs of small files) are
# a few percent of it
STATE_ARGS = [
    "--model.d_model=1024",
    "--model.n_layers=8",
    "--model.n_heads=8",
    "--model.seq_len=16",
    "--train.global_batch=2",
    "--train.micro_batch=1",
]
NAMES = (
    "checkpoint_save_vs_raw_write",
    "checkpoint_async_blocked_vs_sync",
    "checkpoint_steps_per_s_during_async_save_vs_none",
    "checkpoint_load_vs_raw_read",
)
TARGETS = (">= 0.9", "<= 0.1", "-", "<= 1.5")
# Any: one repetition as json.loads reads the worker's output (benchmarks/workers/ckpt.py)
Rep = dict[str, Any]


def _job(
    train_args: list[str], reps: int, extra: list[str], warmup: int = 1
) -> tuple[list[Rep], float]:
    """The worker's repetitions (the first `warmup` dropped) and the job's seconds."""
    run_dir = common.scratch("ckpt-")
    out = run_dir.parent / f"{run_dir.name}.json"
    t0 = time.monotonic()
    cmd = [*common.torchrun(2), str(common.BENCH / "workers" / "ckpt.py")]
    cmd += ["--run-dir", str(run_dir), "--reps", str(reps), "--out", str(out), *extra]
    common.run(cmd, timeout=600, extra_env={"BENCH_TRAIN_ARGS": json.dumps(train_args)})
    return json.loads(out.read_text())["reps"][warmup:], time.monotonic() - t0


def _med(rows: list[Rep], key: str) -> float:
    return common.median([x[key] for x in rows])


def run(quick: bool) -> list[common.Row]:
    reps, steps = (4, 5) if quick else (6, 5)
    reps = max(2, common.reps(reps))  # the first one is a warm-up
    # The 1.2 GB state: this disk is noisy, and a run's first big saves write slower (2026-12-07
    # 22:36: the 2nd-4th saves 0.73-1.30 s, then 0.52-0.56; their write phase took 2-5x the CPU
    # of the later ones while the raw writes between them ran at full speed): 4 warm-ups
    big_warmup = 1 if quick else 4
    big_reps = max(2, common.reps(3 if quick else 8)) + big_warmup
    state_args = json.loads(os.environ.get("BENCH_CKPT_ARGS", "null")) or STATE_ARGS
    try:
        small, small_s = _job(TRAIN_ARGS, reps, ["--steps", str(steps)])
        big, big_s = _job(
            [*TRAIN_ARGS, *state_args], big_reps, ["--steps", "0", "--loads"], big_warmup
        )
    except common.NotMeasured as e:
        return [common.not_measured(n, t, str(e)) for n, t in zip(NAMES, TARGETS, strict=True)]
    setup: Rep = {"strategy": "ddp", "processes": 2, "warmup_reps_dropped": 1}
    small_setup = {**setup, "train_args": TRAIN_ARGS, "reps_used": len(small), "job_s": small_s}
    big_setup = {
        **setup,
        "train_args": [*TRAIN_ARGS, *state_args],
        "reps_used": len(big),
        "warmup_reps_dropped": big_warmup,
        "job_s": big_s,
        "reps": big,
    }
    return [
        _save_row(big, big_setup, small),
        *_async_rows(small, small_setup, steps),
        _load_row(big, big_setup),
    ]


def _save_row(r: list[Rep], setup: Rep, small: list[Rep]) -> common.Row:
    mb = _med(r, "bytes") / 1e6
    phases = {
        k: common.median([x["sync_phases"].get(k, 0.0) for x in r])
        for k in r[0].get("sync_phases", {})
    }
    breakdown = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in phases.items())
    save_s, raw_s = _med(r, "sync_save_s"), _med(r, "raw_write_s")
    small_ratio = common.median([x["raw_write_s"] / x["sync_save_s"] for x in small])
    return common.settle(
        NAMES[0],
        [x["raw_write_s"] / x["sync_save_s"] for x in r],
        TARGETS[0],
        **setup,
        sync_phases_median_s=phases,
        cpu_s={"save": _med(r, "sync_save_cpu_s"), "raw_write": _med(r, "raw_write_cpu_s")},
        demo_state={"mb": round(_med(small, "bytes") / 1e6, 1), "ratio": round(small_ratio, 3)},
        summary=f"sync save of {mb:.0f} MB on 2 ranks: {mb / save_s:.0f} MB/s ({save_s:.3f} s); "
        f"raw write+fsync of the same bytes {mb / raw_s:.0f} MB/s ({raw_s:.3f} s); at the demo "
        f"state ({_med(small, 'bytes') / 1e6:.0f} MB) {small_ratio:.3f}; rank 0: {breakdown}",
    )


def _async_rows(r: list[Rep], setup: Rep, steps: int) -> list[common.Row]:
    blocked = [
        x.get("async_blocked_s")
        or x["async_call_blocked_s"]
        + x.get("async_hook_wait_s", 0.0)
        + x["async_wait_after_steps_s"]
        for x in r
    ]
    during = [x["plain_steps_s"] / x["async_save_plus_steps_s"] for x in r]
    return [
        common.settle(
            NAMES[1],
            [b / x["sync_save_s"] for b, x in zip(blocked, r, strict=True)],
            TARGETS[1],
            **setup,
            reps=r,
            summary=f"async save blocks the loop {common.median(blocked):.4f} s (call "
            f"{_med(r, 'async_call_blocked_s'):.4f} s + the next optimizer step waiting for "
            f"the staging copy {_med(r, 'async_hook_wait_s'):.4f} s + wait "
            f"{_med(r, 'async_wait_after_steps_s'):.4f} s) vs a sync save "
            f"{_med(r, 'sync_save_s'):.3f} s",
        ),
        common.result(
            NAMES[2],
            common.median(during),
            TARGETS[2],
            None,
            spread=common.spread_of(during),
            **setup,
            summary=f"{steps} steps while the background write runs: "
            f"{_med(r, 'async_save_plus_steps_s'):.3f} s (the save call included); "
            f"the same steps with no save {_med(r, 'plain_steps_s'):.3f} s",
        ),
    ]


def _load_row(r: list[Rep], setup: Rep) -> common.Row:
    mb = _med(r, "bytes") / 1e6

    def ratios(cache: str, read: str = "raw_read") -> list[float]:
        return [x[f"load_{cache}_s"] / x[f"{read}_{cache}_s"] for x in r]

    def med(values: list[float]) -> dict[str, object]:
        return {"median": round(common.median(values), 3), "spread": common.spread_of(values)}

    load_s, read_s = _med(r, "load_cold_s"), _med(r, "raw_read_cold_s")
    warm = common.median(ratios("warm"))
    return common.settle(
        NAMES[3],
        ratios("cold"),
        TARGETS[3],
        **setup,
        page_cache="cold (posix_fadvise DONTNEED of every file before each load and read)",
        warm=med(ratios("warm")),
        vs_reads_dropped={
            "cold": med(ratios("cold", "raw_read_dropped")),
            "warm": med(ratios("warm", "raw_read_dropped")),
        },
        cpu_s={
            f"{k}_{c}": round(_med(r, f"{k}_{c}_cpu_s"), 3)
            for k in ("load", "raw_read", "raw_read_dropped")
            for c in ("cold", "warm")
        },
        summary=f"load (each digest checked as its bytes are copied, DCP's planning, 2 ranks each "
        f"reading all {mb:.0f} MB) {load_s:.3f} s; raw read of the same bytes into memory "
        f"{read_s:.3f} s (page cache cold; into a dropped 8 MiB buffer "
        f"{_med(r, 'raw_read_dropped_cold_s'):.3f} s); warm: {warm:.2f}x",
    )
