"""Time train_entry's Checkpointer beside a raw write + fsync of the same bytes (2 ranks, gloo).

    BENCH_TRAIN_ARGS='["--model.d_model=256"]' python -m torch.distributed.run --standalone \
        --nproc-per-node 2 benchmarks/workers/ckpt.py --run-dir D --reps 3 --out ckpt.json

Each repetition, in turn: K plain training steps; an async save then K steps (the training time the
async save costs is this minus the plain K steps); a sync save; rank 0 writes and fsyncs the same
number of bytes raw into the same folder; a fresh Checkpointer loads the newest checkpoint.

The time a save blocks the loop is each rank's own (from a barrier to the call's return, with no
barrier after it), the slowest rank's taken (an all-reduce MAX).
"""

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from benchmarks.baselines.raw_write import raw_write  # noqa: E402
from benchmarks.workers.loop import job  # noqa: E402
from train_entry.checkpoint.checkpointer import Checkpointer  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--run-dir", type=Path, required=True)
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--steps", type=int, default=10, help="K: training steps after an async save")
ap.add_argument("--out", required=True)
args = ap.parse_args()

j = job()
rank = j.info.rank
ckpt = Checkpointer(args.run_dir, strategy=j.cfg.strategy, keep=2)
j.train(2)  # the optimizer has state to save


def timed(fn: Callable[[], object]) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def slowest(*seconds: float) -> list[float]:
    """Each figure's maximum over the ranks."""
    t = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def settle() -> None:
    """Commit the filesystem's journal (the pruned folders' deletes, a discard-mounted disk's
    trims) before a timed write, so neither the save nor the raw write pays for earlier work."""
    if rank == 0 and (args.run_dir / "checkpoints").is_dir():
        fd = os.open(args.run_dir / "checkpoints", os.O_RDONLY)  # the deletes changed it
        os.fsync(fd)
        os.close(fd)


def own(fn: Callable[[], object]) -> float:
    """This rank's seconds in fn, from a barrier (the ranks start together) to fn's return."""
    settle()
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def folder_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


rows = []
for _ in range(args.reps):
    plain = timed(lambda: j.train(args.steps))

    box: dict[str, float] = {}

    def async_then_train(box: dict[str, float] = box) -> None:
        t0 = time.perf_counter()
        ckpt.save(j.state, sync=False)
        box["call"] = time.perf_counter() - t0  # until the loop has it back (the GIL included)
        j.train(args.steps)

    async_section = timed(async_then_train)
    hook_wait = ckpt.timings[-1].get("hook_wait_s", 0.0)
    wait_s = own(ckpt.wait)
    call_blocked, hook_wait, wait_s, blocked = slowest(
        box["call"], hook_wait, wait_s, box["call"] + hook_wait + wait_s
    )
    async_phases = ckpt.timings[-1].get("phases", {})
    j.train(1)
    saved: dict[str, Path] = {}

    def sync_save(saved: dict[str, Path] = saved) -> None:
        saved["path"] = ckpt.save(j.state, sync=True)

    (sync_s,) = slowest(own(sync_save))
    ckpt.wait()  # the pruned folder's delete (on a thread) is over before the raw write starts
    nbytes = folder_bytes(saved["path"])
    settle()
    raw = raw_write(nbytes, args.run_dir) if rank == 0 else None
    dist.barrier()
    load_s = timed(
        lambda: Checkpointer(args.run_dir, strategy=j.cfg.strategy, log=lambda m: None).load_latest(
            j.state
        )
    )
    rows.append(
        {
            "plain_steps_s": plain,
            "async_save_plus_steps_s": async_section,
            "async_call_blocked_s": call_blocked,
            "async_hook_wait_s": hook_wait,
            "async_wait_after_steps_s": wait_s,
            "async_blocked_s": blocked,
            "async_phases": async_phases,
            "sync_phases": ckpt.timings[-1].get("phases", {}),
            "sync_save_s": sync_s,
            "bytes": nbytes,
            "load_s": load_s,
            "raw_write_s": raw and raw["write_s"],
            "raw_read_s": raw and raw["read_s"],
        }
    )
if rank == 0:
    Path(args.out).write_text(
        json.dumps({"steps_after_async": args.steps, "world_size": j.info.world_size, "reps": rows})
    )
dist.destroy_process_group()
# gloo can abort a finished worker at interpreter exit (train_entry.dist.exit_now)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
