"""Scale of the preflight gate, of `status` on a big failed run, and of the watchdog's heartbeat
(issue 37), in simulation: counts, not times.

Gate: the nodes' polling for the all-reduce's member list (hpctrain/checks/preflight/poll.py) at
4, 64 and 1,024 nodes, on a simulated clock, with fabricated reports that land over 5 s (seeded).
Node 0 runs `gather` (one listing of the gate's folder per poll, each report read once), every
other node `wait_members` (one open of members.json per poll, and one look for fail-0.txt). The
figure is the filesystem calls per node (os.open/fstat/stat/lstat/scandir/listdir while polling),
the mean over all nodes; its growth exponent from 4 to 1,024 nodes is the row (target <= 0.1).
Node 0's own count is in the details: it reads the N reports once (O(N), on node 0 only).
Before (issue 37's measure): every node stat-ed every report every 0.2 s, ~47.5k stats a node at
1,024 nodes.

Status: a failed 1,000 x 8 run folder (1,000 node logs and 8,000 rank logs of 200 KB each, sparse
but for a header and a realistic tail; 8,000 failure records, the first one a CUDA error on rank
3,339, the others lost peers over the next 5-35 s) and `hpctrain status RUN`'s detail read in this
process; the figure is the bytes it read (/proc/self/io rchar), target <= 10 MB.

Heartbeat: a rank's Watchdog beating 10 times a second for one simulated minute; the figure is the
fsyncs (target 0), the writes are in the details.

    .venv/bin/python benchmarks/run.py --only scale      # (hooked into the scale group)
    .venv/bin/python -c "from benchmarks import scale_gate as s; print(s.run(True))"
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from unittest import mock

from benchmarks import common
from hpctrain.checks.preflight import MEMBERS, NODE_REPORT, poll
from hpctrain.kernel import failures, layout

FS_CALLS = ("open", "fstat", "stat", "lstat", "scandir", "listdir")
SPREAD_S = 5.0  # the nodes finish their local checks within this (a loaded allocation)
BUDGET_S = 60.0
FIRST_RANK = 3339  # the fabricated run's first failure (node 417, local rank 3)
T0 = 1_800_000_000.0
FIRST_ERROR = "RuntimeError: CUDA error: an illegal memory access was encountered"
LOST = "torch.distributed.DistBackendError: NCCL communicator was aborted on rank {r}"


class Counted:
    """Filesystem calls made through `os` while `on` is set (the simulation's own file writes,
    made while it is off, do not count)."""

    def __init__(self) -> None:
        self.calls = 0
        self.on = False

    @contextlib.contextmanager
    def patched(self) -> Iterator[Counted]:
        real = {name: getattr(os, name) for name in FS_CALLS}

        def wrap(fn: Callable[..., object]) -> Callable[..., object]:
            def counted(*a: object, **k: object) -> object:
                self.calls += self.on
                return fn(*a, **k)

            return counted

        with contextlib.ExitStack() as stack:
            for name, fn in real.items():
                stack.enter_context(mock.patch.object(os, name, wrap(fn)))
            yield self


def fake_report(node: int) -> dict[str, object]:
    rows = [
        {"name": n, "status": "pass", "detail": f"{n} fine on node {node}"}
        for n in ("imports", "entry", "interface", "shm", "matmul", "nan")
    ]
    return {
        "node": node, "name": f"n{node}", "host": f"n{node}", "pid": 1000 + node, "ok": True,
        "when": "start", "checks": rows, "matmul_s": 0.01, "device": "cpu",
        "addr": f"10.0.{node // 256}.{node % 256}", "port": 29500, "seconds": 3.0,
    }  # fmt: skip


@dataclass(frozen=True)
class GateSim:
    """Filesystem calls while polling: the mean over all nodes, node 0's, the other nodes'."""

    nodes: int
    mean: float
    node0: int
    others_max: int
    others_mean: float


def simulate_gate(folder: Path, nodes: int, seed: int = 0) -> GateSim:
    """Every node's filesystem calls while it polls, on a simulated clock (see the docstring)."""
    rng = random.Random(seed)
    done = sorted((rng.uniform(0, SPREAD_S), n) for n in range(nodes))  # (time, node)
    at = {n: t for t, n in done}
    folder.mkdir(parents=True, exist_ok=True)
    count = Counted()
    written = [0]

    def land(now: float) -> None:  # the reports whose node finished by `now` appear
        count.on = False
        while written[0] < nodes and done[written[0]][0] <= now:
            n = done[written[0]][1]
            (folder / NODE_REPORT.format(node=n)).write_text(json.dumps(fake_report(n)))
            written[0] += 1

    class Clock:
        def __init__(self, t: float) -> None:
            self.t = t

        def now(self) -> float:
            return self.t

        def sleep(self, s: float, then: Callable[[float], None]) -> None:
            self.t += s
            then(self.t)
            count.on = True

    per_node: dict[int, int] = {}
    with count.patched():
        clock = Clock(at[0])
        land(clock.t)
        count.on, count.calls = True, 0
        got = poll.gather(
            folder, nodes, BUDGET_S * 0.5, clock=clock.now, sleep=partial(clock.sleep, then=land)
        )
        count.on = False
        per_node[0], published = count.calls, clock.t
        assert len(got) == nodes, (len(got), nodes)
        members = [poll.member(r) for r in got.values() if r is not None]
        text = json.dumps({"members": members, "silent": []})
        for n in range(1, nodes):
            (folder / MEMBERS).unlink(missing_ok=True)
            clock = Clock(at[n])

            def publish(now: float) -> None:
                count.on = False
                if now >= published and not (folder / MEMBERS).exists():
                    (folder / MEMBERS).write_text(text)

            publish(clock.t)
            count.on, count.calls = True, 0
            seen = poll.wait_members(
                folder, BUDGET_S * 0.6, clock=clock.now, sleep=partial(clock.sleep, then=publish)
            )
            count.on = False
            assert seen is not None and len(seen["members"]) == nodes
            per_node[n] = count.calls
    others = [per_node[n] for n in range(1, nodes)]
    return GateSim(
        nodes=nodes,
        mean=sum(per_node.values()) / nodes,
        node0=per_node[0],
        others_max=max(others),
        others_mean=sum(others) / len(others),
    )


def _sparse(path: Path, size: int, head: str, tail: str) -> None:
    """A log of `size` bytes: `head` at the start, `tail` at the end, a hole between (it reads as
    zeros: a reader that reads the whole file still pays for every byte)."""
    with open(path, "wb") as f:
        f.write(head.encode())
        body = tail.encode()
        f.seek(max(len(head), size - len(body)))
        f.write(body)


def _block(entries: list[tuple[int, int, float]], host: str) -> str:
    """torchrun's ChildFailedError block, (rank, exit code, time) each, the first the root cause."""

    def entry(i: int, rank: int, code: int, t: float) -> str:
        stamp = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(t))
        return (
            f"[{i}]:\n  time      : {stamp}\n  host      : {host}\n"
            f"  rank      : {rank} (local_rank: {rank % 8})\n  exitcode  : {code} (pid: 9{rank})\n"
            "  error_file: <N/A>\n  traceback : To enable traceback see: "
            "https://pytorch.org/docs/stable/elastic/errors.html\n"
        )

    root, *others = entries
    rule = "=" * 60
    return (
        "Traceback (most recent call last):\n"
        '  File ".../torch/distributed/run.py", line 1019, in run\n'
        f"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n{rule}\n"
        f"train_entry FAILED\n{'-' * 60}\nFailures:\n"
        + "".join(entry(i + 1, *o) for i, o in enumerate(others))
        + f"{'-' * 60}\nRoot Cause (first observed failure):\n{entry(0, *root)}{rule}\n"
    )


def fabricate_failed_run(run: Path, nodes: int = 1000, per: int = 8, log_kb: int = 200) -> None:
    """The logs, records and restarts.jsonl of a failed nodes x per torchrun run (see the
    docstring) in `run`, an existing run folder."""
    logs, size = run / layout.LOGS, log_kb << 10
    where = run / failures.folder("77", 0)
    logs.mkdir(exist_ok=True)
    where.mkdir(parents=True)
    with open(run / layout.RESTARTS, "a") as f:
        f.write(json.dumps({"time": "2027-01-15T08:00:00Z", "job_id": "77", "restart_count": 0}))
        f.write("\n")
    rng = random.Random(1)
    first_node = FIRST_RANK // per
    steps = "".join(f"[rank{{r}}]:step {s}/90000 loss 2.{s % 97:02d} 0.41 s\n" for s in range(20))
    for node in range(nodes):
        host, entries, tail = f"n{node}", [], ""
        for local in range(per):
            r = node * per + local
            t = T0 + (0.0 if r == FIRST_RANK else rng.uniform(5, 35))
            error = FIRST_ERROR if r == FIRST_RANK else LOST.format(r=r)
            if node == first_node and r != FIRST_RANK:
                entries.append((r, -15, T0 + 1))  # torchrun stopped its node's other ranks
            else:
                rec = {"rank": r, "node": node, "host": host, "pid": 9000 + r, "time": t,
                       "error": error, "lost_peer": failures.lost_peer(error)}  # fmt: skip
                path = where / f"rank-{r}.json"
                path.write_text(json.dumps(rec) + "\n")
                os.utime(path, (t + 0.05, t + 0.05))
                entries.append((r, 1, t))
            traceback = (
                f'Traceback (most recent call last):\n  File "train_entry/trainer.py", line 412,'
                f" in step\n    loss.backward()\n{error}\n"
            )
            rank_tail = steps.replace("[rank{r}]:", "") + traceback
            _sparse(logs / f"rank-{r}.log", size, f"rank {r} on {host}\n", rank_tail)
            tail += steps.format(r=r) + "".join(f"[rank{r}]:{x}\n" for x in traceback.splitlines())
        entries.sort(key=lambda e: (e[0] != FIRST_RANK, e[2]))
        head = f"hpctrain: node {node} on {host} device=cuda gpu=8 restart=0 endpoint=n0:29500\n"
        _sparse(logs / f"node-{node}.log", size, head, tail + _block(entries, host))


def rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise common.NotMeasured("no rchar in /proc/self/io")


def status_bytes(run: Path) -> tuple[int, dict[str, object] | None]:
    """The bytes `hpctrain status RUN` reads (its detail: the summary, history, progress, root
    cause, health), and the root cause it names."""
    from hpctrain.runs.folder import RunDir  # lazy: the CLI's import cost stays out of the bench
    from hpctrain.service.status import detail  # lazy: as above

    before = rchar()
    d = detail(RunDir(run))
    read = rchar() - before
    return read, d.root_cause.to_json() if d.root_cause else None


def make_run(root: Path, name: str) -> Path:
    """An empty FAILED local run folder, as `submit` makes it."""
    from hpctrain.jobs.request import JobRequest  # lazy: as above
    from hpctrain.profiles import resolve  # lazy: as above
    from hpctrain.runs.folder import RunDir  # lazy: as above

    profile = resolve("local", {})
    run = RunDir(root / "runs" / name)
    run.create(profile=profile, request=JobRequest.build(profile, name=name), script="exit 1\n")
    (run.path / "state.json").write_text('{"state": "FAILED", "exit_code": 1}\n')
    return run.path


def heartbeat_fsyncs(run: Path, minutes: float = 1.0) -> tuple[int, int]:
    """(fsyncs, heartbeat writes) of one rank's watchdog (stall_s 300) beating 10 times a second
    for `minutes` of simulated time."""
    from train_entry.watchdog import Watchdog  # lazy: train_entry's imports, only here

    clock = [1000.0]
    fsyncs, writes = [0], [0]
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        fsyncs[0] += 1
        real_fsync(fd)

    def replace(a: object, b: object) -> None:
        writes[0] += 1
        real_replace(a, b)  # type: ignore[arg-type]

    dog = Watchdog(run, rank=0, stall_s=300.0)  # not started: the beats only
    with (
        mock.patch.object(time, "monotonic", lambda: clock[0]),
        mock.patch.object(os, "fsync", fsync),
        mock.patch.object(os, "replace", replace),
    ):
        for step in range(int(minutes * 600)):
            clock[0] += 0.1
            dog.beat(step)
    return fsyncs[0], writes[0]


def run(quick: bool) -> list[common.Row]:
    del quick  # counts, not times: the same work either way (~20 s)
    work = common.scratch("scale-gate-")
    rows: list[common.Row] = []
    sims = [simulate_gate(work / f"gate-{n}", n) for n in (4, 64, 1024)]
    growth = math.log(sims[-1].mean / sims[0].mean) / math.log(1024 / 4)
    means = ", ".join(f"{s.nodes}: {s.mean:.1f}" for s in sims)
    rows.append(
        common.result(
            "scale_gate_fs_calls_per_node_growth_exponent",
            growth,
            "<= 0.1",
            growth <= 0.1,
            sims=[asdict(s) for s in sims],
            summary=f"filesystem calls per node while polling (nodes: mean) {means}; node 0 reads "
            f"every report once ({sims[-1].node0} calls at 1,024); before: ~47.5k stats a node",
        )
    )
    make_run(work, "warm")
    small = make_run(work, "small")
    fabricate_failed_run(small, nodes=2, per=8, log_kb=4)
    status_bytes(small)  # the lazy imports' reads stay out of the figure
    big = make_run(work, "big")
    fabricate_failed_run(big)
    read, cause = status_bytes(big)
    mb = read / 1e6
    named = bool(cause and cause.get("rank") == FIRST_RANK)
    rows.append(
        common.result(
            "scale_status_failed_1000x8_mb_read",
            mb,
            "<= 10",
            mb <= 10 and named,
            bytes=read,
            root_cause=cause,
            summary=f"`status` of a failed 1,000 x 8 run (9,000 logs of 200 KB, 8,000 records) "
            f"read {mb:.2f} MB and named rank {cause and cause.get('rank')} (issue 37: 1.7 GB)",
        )
    )
    fsyncs, writes = heartbeat_fsyncs(work)
    rows.append(
        common.result(
            "scale_heartbeat_fsyncs_per_minute_per_rank",
            float(fsyncs),
            "<= 0",
            fsyncs == 0,
            writes_per_minute=writes,
            summary=f"one rank beating 10/s for a minute (stall_s 300): {fsyncs} fsyncs, "
            f"{writes} heartbeat file writes",
        )
    )
    shutil.rmtree(work, ignore_errors=True)
    return rows
