"""Sockets per rank that hpctrain's own gloo groups add (issue 37), on a CPU world of simulated
nodes: the snapshot exchange (recovery.Exchange: two partner exchanges, the agreements, a restore
from the copies) and an async checkpoint save (asyncsave.AsyncWriter: DCP's plan gather, the
commit, the agreement). Counted: socket fds in /proc/self/fd after all of that, minus those after
init_process_group (the job's default group and the store's); the most over the two counts.

    python -m benchmarks.workers.sockets 4 8   # per world, one JSON line per rank
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from pathlib import Path

PER_NODE = 2  # ranks per simulated node


def sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def rank_main(rank: int, world: int, port: int, folder: str) -> None:
    # lazy: imported by `count` before the fork
    import torch
    import torch.distributed as dist

    from hpctrain.kernel import jobenv
    from hpctrain.runtime.recovery import Exchange
    from train_entry.checkpoint.checkpointer import Checkpointer
    from train_entry.state import TrainState

    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
    os.environ |= {"LOCAL_RANK": str(rank % PER_NODE), "LOCAL_WORLD_SIZE": str(PER_NODE)}
    os.environ |= {jobenv.NODEID: str(rank // PER_NODE), jobenv.JOB_ID: "37"}
    os.environ |= {jobenv.SNAPSHOT_DIR: f"{folder}/shm", jobenv.JOB_KEY: "37" * 32}
    os.environ.pop("SLURMD_NODENAME", None)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    base = sockets()
    phases = {}

    def settled() -> int:
        """This rank's count once every rank is done with the phase and none has begun the next
        (a peer's lazy connection lands on this rank's side whenever the peer makes it)."""
        dist.barrier()  # the default group's: connected already
        n = sockets() - base
        dist.barrier()
        return n

    ex = Exchange(f"{folder}/run")
    phases["init"] = settled()
    for step in (1, 2):
        ex.put(step, memoryview(bytearray(bytes([rank, step]) * 500)))
    phases["put"] = settled()
    ex.agree_max(float(rank))
    got = ex.get(newer_than=0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpointer(f"{folder}/run", strategy="ddp", async_save=True)
    state = TrainState(model=model, optimizer=opt, step=1)
    phases["get"] = settled()
    ckpt.save(state, sync=False)
    ckpt.wait()
    ex.agree_all(True)
    added = settled()
    ok = got is not None and got[1] == bytes([rank, 2]) * 500
    print(
        json.dumps({"rank": rank, "base": base, "added": added, "restored": ok, "phases": phases}),
        flush=True,
    )
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # gloo may abort in its static destructors at exit (train_entry/dist.exit_now)


def count(world: int) -> list[dict[str, int]]:
    """Every rank's row of a world of `world` ranks (PER_NODE per node), in rank order."""
    # lazy: torch only where ranks run (the harness's parent stays light)
    import torch.multiprocessing as mp

    import hpctrain.runtime.recovery  # noqa: F401 - imported once, before the fork
    import train_entry.checkpoint.checkpointer  # noqa: F401

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "rows"
        out.mkdir()
        ctx = mp.get_context("fork")  # the imports once (a spawned rank: 3 s of CPU each)
        procs = [
            ctx.Process(target=_row, args=(r, world, port, folder, str(out / f"{r}")))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        rows = [json.loads((out / f"{r}").read_text()) for r in range(world)]
    return rows


def _row(rank: int, world: int, port: int, folder: str, out: str) -> None:
    sys.stdout = open(out, "w")  # noqa: SIM115 - the rank leaves with os._exit after the flush
    rank_main(rank, world, port, folder)


if __name__ == "__main__":
    for world in sys.argv[1:]:
        print(json.dumps({"world": int(world), "rows": count(int(world))}), flush=True)
