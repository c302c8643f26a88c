"""Time train_entry's Checkpointer beside raw I/O of the same bytes (2 ranks, gloo, DDP).

    BENCH_TRAIN_ARGS='["--model.d_model=256"]' python -m torch.distributed.run --standalone \
        --nproc-per-node 2 benchmarks/workers/ckpt.py --run-dir D --reps 3 --out ckpt.json
    # the state of benchmarks/checkpoint.py's save and load rows (1.21 GB), no training between
    BENCH_TRAIN_ARGS='["--model.d_model=1024", "--model.n_layers=8", "--model.n_heads=8", \
        "--model.seq_len=16", "--train.global_batch=2", "--train.micro_batch=1"]' \
        python -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/workers/ckpt.py --run-dir D --reps 3 --steps 0 --loads --out ckpt.json

Each repetition, in turn: with --steps K > 0, K plain training steps, then an async save and K
steps (the training time the async save costs is this minus the plain K steps), then one step;
with --steps 0, no training (the step number moves on, the state is the same bytes). Then a pair:
a sync save, and the raw write (benchmarks/baselines/raw_write.py: each rank writes as many bytes
as its files of that save hold into the same folder, fsyncs its file and the folder), the save
first every time, each after freeing what the same kind of write left (--steps 0: the older
checkpoints, else the pruned one's delete; the previous raw file): each write has the same
history (a write and the other kind's just before it).

With --loads, after the last pair, as many times (in turns): a fresh Checkpointer's load of the
newest checkpoint, the raw read of the same bytes into memory allocated before (each rank reads
every file of it, as a DDP rank's load does, with plain read() calls) and the same read dropping
each chunk; cold (every file's pages dropped from the page cache before each), then warm.

Every figure is each rank's own time from a barrier (the ranks start together) to its return,
the slowest rank's taken (an all-reduce MAX), with its CPU seconds (the process, every thread).
"""

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from benchmarks.baselines.raw_write import drop_cached, raw_read, write_synced  # noqa: E402
from benchmarks.workers.loop import job  # noqa: E402
from hpctrain.kernel.checkpoint import step_folders, step_name  # noqa: E402
from train_entry.checkpoint.checkpointer import Checkpointer  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--run-dir", type=Path, required=True)
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--steps", type=int, default=10, help="K: training steps after an async save")
ap.add_argument("--loads", action="store_true", help="time loads against raw reads too")
ap.add_argument("--out", required=True)
args = ap.parse_args()

j = job()
rank = j.info.rank
# the big state (--steps 0) keeps every save: each save frees the older ones itself (free_save)
ckpt = Checkpointer(args.run_dir, strategy=j.cfg.strategy, keep=2 if args.steps else 1 << 20)
j.train(2 if args.steps else 1)  # the optimizer has state to save


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
    """Commit the filesystem's journal (the pruned folders' and the raw files' deletes, a
    discard-mounted disk's trims) before a timed write, so that no write pays for earlier work."""
    if rank == 0:
        for folder in (args.run_dir, args.run_dir / "checkpoints"):
            if folder.is_dir():
                fd = os.open(folder, os.O_RDONLY)  # the deletes changed it
                os.fsync(fd)
                os.close(fd)


def own(fn: Callable[[], object], before: Callable[[], object] = lambda: None) -> list[float]:
    """This rank's seconds and CPU seconds in fn, from a barrier (the ranks start together) to
    fn's return; `before` runs first, untimed."""
    before()
    settle()
    dist.barrier()
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    return [time.perf_counter() - t0, time.process_time() - c0]


def turns(
    fns: Mapping[str, Callable[[], object]],
    first: int,
    before: Mapping[str, Callable[[], object]] | None = None,
    tag: str = "",
) -> dict[str, float]:
    """{<name><tag>_s, <name><tag>_cpu_s} of each of `fns`, the slowest rank's, in turns: the
    `first`-th (modulo their number) runs first, the others after it in their order; each after
    its `before` (untimed)."""
    names = list(fns)
    order = names[first % len(names) :] + names[: first % len(names)]
    got = {k: own(fns[k], (before or {}).get(k, lambda: None)) for k in order}
    flat = iter(slowest(*(x for k in names for x in got[k])))
    return {f"{k}{tag}{unit}": next(flat) for k in names for unit in ("_s", "_cpu_s")}


def files(folder: Path) -> list[Path]:
    return sorted(f for f in folder.rglob("*") if f.is_file())


def mine(folder: Path) -> int:
    """The bytes of this rank's part of a save: its weights file (rank 0: the other files too)."""
    if rank:
        return (folder / f"__{rank}_0.raw").stat().st_size
    other = (f for f in files(folder) if not f.name.endswith(".raw") or f.name == "__0_0.raw")
    return sum(f.stat().st_size for f in other)


def load() -> None:
    Checkpointer(args.run_dir, strategy=j.cfg.strategy, log=lambda m: None).load_latest(j.state)


def uncached(folder: Path) -> None:
    """Every file of `folder` out of the page cache (they are clean: fsynced), on every rank."""
    dist.barrier()
    if rank == 0:
        for f in files(folder):
            drop_cached(f)
    dist.barrier()


rows = []
raw_file: list[Path | None] = [None]  # this rank's raw write's file, until the next one
share = 0  # this rank's bytes of a save (the same every time: the same tensors)
for _ in range(args.reps):
    row: dict[str, object] = {}
    if args.steps:
        plain = timed(lambda: j.train(args.steps))
        box: dict[str, float] = {}

        def async_then_train(box: dict[str, float] = box) -> None:
            t0 = time.perf_counter()
            ckpt.save(j.state, sync=False)
            box["call"] = time.perf_counter() - t0  # until the loop has it back (the GIL too)
            j.train(args.steps)

        async_section = timed(async_then_train)
        hook_wait = ckpt.timings[-1].get("hook_wait_s", 0.0)
        wait_s = own(ckpt.wait)[0]
        call_blocked, hook_wait, wait_s, blocked = slowest(
            box["call"], hook_wait, wait_s, box["call"] + hook_wait + wait_s
        )
        row.update(
            plain_steps_s=plain,
            async_save_plus_steps_s=async_section,
            async_call_blocked_s=call_blocked,
            async_hook_wait_s=hook_wait,
            async_wait_after_steps_s=wait_s,
            async_blocked_s=blocked,
            async_phases=ckpt.timings[-1].get("phases", {}),
        )
        j.train(1)
    else:
        j.state.step += 1  # a save of the same tensors at the next step
    saved: dict[str, Path] = {}

    def sync_save(saved: dict[str, Path] = saved) -> None:
        saved["path"] = ckpt.save(j.state, sync=True)

    def raw(share: int = share, saved: dict[str, Path] = saved) -> None:
        raw_file[0] = write_synced(share or mine(saved["path"]), args.run_dir)

    # Each write first frees what the same kind of write left (the pruned folder's delete, a
    # thread, or the older checkpoints; the raw file), in the same order every time: each write
    # follows the same history (on this VM's disk, a write into the blocks of the write just
    # before ran 3-5x faster than one into blocks written earlier)
    def free_save() -> None:
        ckpt.wait()
        if rank == 0 and not args.steps:  # keep is high: no prune of their own
            for _, old in step_folders(ckpt.dir):
                shutil.rmtree(old)

    def free_raw() -> None:
        if raw_file[0] is not None:
            raw_file[0].unlink()
            raw_file[0] = None

    # the save first (the raw write's size is a save's)
    got = turns(
        {"sync_save": sync_save, "raw_write": raw},
        0,
        {"sync_save": free_save, "raw_write": free_raw},
    )
    ckpt.wait()
    folder = saved["path"]
    share = mine(folder)
    nbytes = sum(f.stat().st_size for f in files(folder))
    row.update(got, sync_phases=ckpt.timings[-1].get("phases", {}), bytes=nbytes)
    rows.append(row)
    dist.barrier()  # every rank is done with the folder before rank 0 deletes it (free_save)
if raw_file[0] is not None:
    raw_file[0].unlink()
# the loads after every write (a write right after reads ran faster on this VM's disk than one
# right after a write): the newest checkpoint, as many times, in turns
if args.loads:
    folder = ckpt.dir / step_name(j.state.step)
    into = torch.zeros(nbytes, dtype=torch.uint8).numpy().data  # allocated (and touched) now

    def read() -> None:
        raw_read(files(folder), into)

    def read_dropped() -> None:
        raw_read(files(folder))

    def drop() -> None:
        uncached(folder)

    fns = {"load": load, "raw_read": read, "raw_read_dropped": read_dropped}
    for rep, row in enumerate(rows):
        for cache in ("cold", "warm"):
            drops = dict.fromkeys(fns, drop) if cache == "cold" else None
            row.update(turns(fns, rep, drops, f"_{cache}"))
if rank == 0:
    Path(args.out).write_text(
        json.dumps({"steps_after_async": args.steps, "world_size": j.info.world_size, "reps": rows})
    )
dist.destroy_process_group()
# gloo can abort a finished worker at interpreter exit (train_entry.dist.exit_now)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
