"""The network part of a node's preflight (node.py): once the nodes whose local checks passed have
reported, they join one process group (gloo, or NCCL on GPUs) and time an all-reduce; with 3 or
more nodes also each ring pair, so a slow link names its node. Group rank 0 writes `net.json`; a
node whose all-reduce failed writes `net-error-<node>.json`. This module imports torch: node.py
loads it only for the network part, so its local checks still run and report when torch is broken.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.checks.preflight import (
    NET_ERROR,
    NET_REPORT,
    Member,
    NetError,
    NetJson,
    NodeJson,
    Pair,
    write_json,
)

MAX_PAIR_NODES = 64  # ring-pair all-reduces up to this many nodes (one process group per pair)


def timed_allreduce(
    buf: torch.Tensor,
    *,
    group: dist.ProcessGroup | None,
    world: int,
    sync: Callable[[], None],
) -> tuple[float, bool]:
    """Seconds per all-reduce of `buf` (the slowest member's), and whether the sum was right."""
    device = buf.device
    dist.all_reduce(buf, group=group)  # warm-up: connections, buffers
    sync()
    t1 = time.perf_counter()
    dist.all_reduce(buf, group=group)
    sync()
    probe = torch.tensor([time.perf_counter() - t1], dtype=torch.float64, device=device)
    dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=group)
    iters = max(2, min(20, int(0.15 / max(float(probe.item()), 1e-6))))
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf, group=group)
    sync()
    elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    rank = dist.get_rank(group)
    buf.fill_(float(rank + 1))
    dist.all_reduce(buf, group=group)
    ok = torch.tensor(
        [int(bool(torch.all(buf == world * (world + 1) / 2)))], dtype=torch.int32, device=device
    )
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    return float(elapsed.item()), bool(ok.item())


def busbw(nbytes: int, seconds: float, world: int) -> float:
    """GB/s as nccl-tests define it for all-reduce: algbw * 2(n-1)/n."""
    return nbytes / seconds / 1e9 * 2 * (world - 1) / world


def network(
    out: Path, *, me: NodeJson, members: list[Member], nbytes: int, deadline: float
) -> None:
    ids = [m["node"] for m in members]
    rank, world, head = ids.index(me["node"]), len(ids), members[0]
    cuda = me["device"] == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    try:
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=f"tcp://{head['addr']}:{head['port']}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=max(5.0, deadline - time.monotonic())),
        )
        buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        t, ok = timed_allreduce(buf, group=None, world=world, sync=sync)
        result: NetJson = {
            "members": ids,
            "names": [m["name"] for m in members],
            "bytes": nbytes,
            "seconds": t,
            "busbw_gbps": busbw(nbytes, t, world),
            "correct": ok,
            "pairs": [],
            "backend": dist.get_backend(),
        }
        if 3 <= world <= MAX_PAIR_NODES:
            result["pairs"] = _ring_pairs(ids, rank=rank, nbytes=nbytes, device=device, sync=sync)
        if rank == 0:
            write_json(out / NET_REPORT, result)
        if dist.get_backend() != "gloo":  # gloo's may hang a rank (train_entry/compat.py)
            dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001 - the failure is the finding
        error: NetError = {
            "node": me["node"],
            "name": me["name"],
            "error": f"{type(e).__name__}: {e}"[:800],
        }
        write_json(out / NET_ERROR.format(node=me["node"]), error)


def _ring_pairs(
    ids: list[int], *, rank: int, nbytes: int, device: torch.device, sync: Callable[[], None]
) -> list[Pair]:
    """Every ring pair (i, i+1) timed, in two rounds of disjoint pairs (three when the count is
    odd); every rank gets every pair's row."""
    world = len(ids)
    pairs = [(i, (i + 1) % world) for i in range(world)]
    groups = [dist.new_group(list(p)) for p in pairs]
    mine: list[Pair] = []
    for parity in (0, 1, 2):
        for (a, b), g in zip(pairs, groups, strict=True):
            rnd = 2 if (world % 2 and a == world - 1) else a % 2
            if rnd == parity and rank in (a, b):
                small = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
                pt, pok = timed_allreduce(small, group=g, world=2, sync=sync)
                if rank == a:
                    row: Pair = {
                        "a": ids[a],
                        "b": ids[b],
                        "seconds": pt,
                        "busbw_gbps": busbw(nbytes, pt, 2),
                        "correct": pok,
                    }
                    mine.append(row)
        dist.barrier()
    gathered: list[list[Pair] | None] = [None] * world
    dist.all_gather_object(gathered, mine)
    return [p for part in gathered for p in part or []]
