"""What an in-job restart needs on a training rank, shared by train_entry and the runtime API
(`preemption.max_in_job_restarts`, hpctrain/kernel/fatal.py; docs/recovery.md). Imports torch: only
a rank that has it loads this module (`runtime.Checkpoint` on its first snapshot or load).

A worker that dies, stalls or times out is restarted inside the job: torchrun's agent starts the
group again (`--max-restarts`, TORCHELASTIC_RESTART_COUNT), or the batch shell starts a new srun
step (launcher srun, IN_JOB_RESTART). A worker started again after an error that repeats (the FATAL
file) or after a stop was asked (the STOP file) leaves at once (kernel/fatal.refused_start, before
torch). On top of that:

- `agreed_restart`: whether this start is a restart. One all-reduce MAX at start: a torchrun agent
  that restarts its node's workers because another node's failed counts no restart of its own.
- `record` (restarts.py, torch-free): rank 0 writes one `in_job_restart` event per restart.
- Snapshots in memory: every N steps each rank keeps its state as bytes in node-local memory
  (kernel/snapshot.py) and sends a copy to its partner, the rank with its local rank on a node of
  another rack, else N/2 nodes away (`Exchange`, kernel/partners.py). At an in-job restart the
  newest snapshot every rank can get (`choose`) loads when it is newer than the newest disk
  checkpoint. Snapshots never move `latest`.
  `Snapshots` decides when (every N steps, or auto: under `budget` of a step) and whether they
  fit in memory; what goes in is the caller's (`payload`: the state, `apply`: it loaded, thawed):
  train_entry/snapshot.for_train_state, runtime.Checkpoint.snapshot. The loop waits only for
  `frozen.freeze`; the bytes are stored and sent beside training, signed with the job key.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from statistics import median_high

import torch
import torch.distributed as dist

from hpctrain.kernel import fatal, jobenv, partners
from hpctrain.kernel import snapshot as store
from hpctrain.kernel.rundir import RunFolder
from hpctrain.runtime.frozen import Buffer, freeze, thaw
from hpctrain.runtime.restarts import record as record  # public here too (train_entry's)


def enabled(every: int | None) -> bool:
    """Snapshots serve in-job restarts: a run hpctrain started (a job id), not set off."""
    return every != 0 and bool(jobenv.get(jobenv.JOB_ID))


def agreed_restart(device: torch.device) -> int:
    """The largest restart count of any rank (0: the first start). A collective, once per start."""
    mine = fatal.restarts()
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    t = torch.tensor([mine], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


# ---------------------------------------------------------------- snapshots in memory
MEMORY_SHARE = store.MEMORY_SHARE  # one source: the plan shows the same check
CALIBRATE = 5  # auto: snapshots at every step measure the cost, the first (fresh memory) left out
PG_TIMEOUT_S = 600  # the exchange's collective timeout without watchdog.pg_timeout_s
AIM = 0.75  # auto: the plan's share of the budget (a plan at 2% measured 0.0178 [0.0141-0.0212])
Pairs = list[tuple[torch.Tensor, int]]  # (tensor, peer rank) of point-to-point sends or receives


class Exchange:
    """Snapshot bytes between the ranks. Every method is a collective of every rank."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        up = dist.is_available() and dist.is_initialized()
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if up else (0, 1)
        self.folder = store.node_folder(run_dir)
        self.node = store.node_name()
        # own gloo groups: the bytes are on the CPU (NCCL moves no CPU tensors), the exchange never
        # interleaves with the training group's collectives, and `put` (the snapshot thread's) never
        # with `get` and the agreements (the loop's); the job's collective timeout (torch's: 30
        # min): a rank whose write hangs fails its partner in that time, as any lost peer does
        wait = timedelta(seconds=float(jobenv.get(jobenv.PG_TIMEOUT_S) or PG_TIMEOUT_S))
        # lazy (partners.lazy_gloo): a pair connects at its first message, so the exchange holds
        # its partner's and source's connections and the agreements' ring neighbours' (flat in
        # the world size; torch < 2.8: the full mesh of each group)
        with partners.lazy_gloo():
            self.group = dist.new_group(backend="gloo", timeout=wait) if self.world > 1 else None
            self.side = dist.new_group(backend="gloo", timeout=wait) if self.world > 1 else None
        host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        mine = json.dumps([self.node, partners.rack_of(host, jobenv.get(jobenv.RACKS))])
        where = [json.loads(raw) for raw in self.gather(mine.encode())]
        # another rack's node, else the node N/2 away (one node: the copy would sit in the same
        # memory); a restart reads a lost node's ranks from the same partners (`get`)
        self.partners = partners.partners([str(w[0]) for w in where], [str(w[1]) for w in where])
        self.partner = self.partners[self.rank]
        self.source = partners.sources(self.partners)[self.rank]
        self._got: torch.Tensor | None = None
        self.unsafe = store.ready(self.folder)  # why snapshots cannot be kept here, or None
        self.failed: str | None = None  # the newest write that failed (the run goes on)
        if self.unsafe is None and int(os.environ.get("LOCAL_RANK") or 0) == 0:
            store.clean_stale(run_dir)

    def put(self, step: int, data: memoryview, send: bool = True) -> tuple[float, float]:
        """Keep this rank's `data` of `step` here and, when `send` (the same on every rank), on the
        partner's node. The partner checks the copy with the job key (its signed header and
        digest) before it stores it. (CPU seconds of the own copy, seconds of the partner's.)"""
        t = time.thread_time()
        sent = send and self.partner is not None
        digest = store.checksum(data)
        self._keep(self.rank, step, data, digest=digest, anchor=sent)
        own = time.thread_time() - t
        to = [self.partner] if sent and self.partner is not None else []
        source = self.source if send else None  # whose copy comes here
        if not to and source is None:
            return own, 0.0
        t = time.perf_counter()
        mac = store.header(
            folder=self.folder,
            rank=self.rank,
            step=step,
            world=self.world,
            size=len(data),
            digest=digest,
        )["mac"]
        signature = torch.frombuffer(bytearray.fromhex(str(mac)), dtype=torch.int64)
        # the 64-bit digest as a signed int64 on the wire, the signature after it
        head = torch.cat([torch.tensor([len(data), digest - (digest >> 63 << 64)]), signature])
        theirs = torch.zeros(6, dtype=torch.int64)
        self._pairs(
            [(head, p) for p in to], [(theirs, source)] if source is not None else [], self.side
        )
        if source is None:
            self._pairs([(torch.frombuffer(data, dtype=torch.uint8), p) for p in to], [], self.side)
            return own, time.perf_counter() - t
        size, digest = (int(v) for v in theirs[:2].tolist())
        meta: dict[str, object] = dict(step=step, rank=source, world=self.world, size=size)
        meta |= {"digest": digest % (1 << 64), "mac": theirs[2:].numpy().tobytes().hex()}
        if self._got is None or self._got.numel() != size:  # reused: fresh memory faults its pages
            self._got = torch.empty(max(0, size), dtype=torch.uint8)
        got = self._got
        mine = torch.frombuffer(data, dtype=torch.uint8)
        self._pairs([(mine, p) for p in to], [(got, source)], self.side)
        if store.valid(got.numpy().data, meta, self.folder, source, step):
            self._keep(source, step, got.numpy().data, digest=digest % (1 << 64))
        else:
            self.failed = f"the copy rank {source} sent of step {step} did not verify"
        return own, time.perf_counter() - t

    def _keep(
        self, rank: int, step: int, data: memoryview, *, digest: int, anchor: bool = False
    ) -> None:
        """A failed write (a full or vanished folder) costs that copy, not the run: every rank
        still takes part in the exchange, and a restart chooses among the copies there are."""
        try:
            store.write(self.folder, rank, step, data, self.world, digest=digest, anchor=anchor)
        except OSError as e:
            self.failed = f"{type(e).__name__}: {e}"

    def get(self, newer_than: int) -> tuple[int, bytes] | None:
        """(step, this rank's data) of the newest step every rank's snapshot is held for (one copy
        per node, the same checksum), when newer than `newer_than`; None on every rank otherwise,
        or when any rank's copy fails its check."""
        mine = (self.node, store.listing(self.folder))
        held = [mine]
        if self.group is not None:
            held = [store.load(raw, self.folder) for raw in self.gather(store.dump(*mine))]
        step, source = store.choose(held, self.world, newer_than)
        if step is None:
            return None
        source = partners.route(source, held, step, self.partners)  # the pairs `put` connected
        data = None
        sends: Pairs = []
        recvs: Pairs = []
        for rank, (holder, meta) in source.items():
            if holder == self.rank and rank == self.rank:
                data = store.read(self.folder, rank, step, meta)
            elif holder == self.rank:
                out = store.read(self.folder, rank, step, meta) or bytes(int(str(meta["size"])))
                sends.append((torch.frombuffer(bytearray(out), dtype=torch.uint8), rank))
            elif rank == self.rank:
                box = torch.empty(int(str(meta["size"])), dtype=torch.uint8)
                recvs.append((box, holder))
        if sends or recvs:
            self._pairs(sends, recvs, self.group)
        if recvs:
            got = recvs[0][0].numpy().tobytes()
            ok = store.valid(got, source[self.rank][1], self.folder, self.rank, step)
            data = got if ok else None
        if not self.agree_all(data is not None) or data is None:
            return None
        return step, data

    def gather(self, raw: bytes) -> list[bytes]:
        """Every rank's `raw`, in rank order (bytes: what another rank sends is never unpickled)."""
        if self.group is None:
            return [raw]
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([len(raw)]), group=self.group)
        top = max(1, *(int(n) for n in sizes))
        mine = torch.zeros(top, dtype=torch.uint8)
        mine[: len(raw)] = torch.frombuffer(bytearray(raw or b"-"), dtype=torch.uint8)[: len(raw)]
        boxes = [torch.empty(top, dtype=torch.uint8) for _ in range(self.world)]
        dist.all_gather(boxes, mine, group=self.group)
        return [bytes(b[: int(n)].numpy()) for b, n in zip(boxes, sizes, strict=True)]

    def _pairs(self, sends: Pairs, recvs: Pairs, group: dist.ProcessGroup | None) -> None:
        reqs = [dist.isend(t, peer, group=group) for t, peer in sends]
        reqs += [dist.irecv(t, peer, group=group) for t, peer in recvs]
        for req in reqs:
            if req is not None:
                req.wait()

    def agree_all(self, ok: bool) -> bool:
        if self.group is None:
            return ok
        flag = torch.tensor([int(ok)], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    def agree_max(self, *values: float) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        if self.group is not None:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return [float(v) for v in t.tolist()]


choose, intervals = store.choose, store.intervals  # the store's (no torch): one place


class Snapshots:
    """The trainer's snapshots: `step` at step boundaries, `restore` at an in-job restart.

    The loop waits only while the state of this step is copied (`freeze`); a thread stores the
    bytes and sends the partner's copy while training goes on (as Gemini and NVIDIA's async local
    checkpoints do), one snapshot at a time: the next one waits for it. The auto interval counts
    both: on a node that trains on its CPU the thread's CPU time comes out of training."""

    def __init__(
        self,
        run_dir: Path,
        *,
        every: int | None,
        budget: float,
        payload: Callable[[], object],  # the state: containers of tensors (frozen.freeze)
        apply: Callable[[dict[str, object]], int],  # that state, thawed
        log: Callable[[str], None],
    ) -> None:
        self.run_dir = run_dir
        self.exchange = Exchange(run_dir)
        self.every, self.budget, self.auto = every, budget, every is None
        self.partner_every: int | None = None  # auto on a CPU node: the partner's copy less often
        self.payload, self.apply, self.log = payload, apply, log
        self._last: float | None = None
        self._step_s: list[float] = []
        self._put: threading.Thread | None = None
        self._failed: BaseException | None = None
        self._said = False
        self._buf = Buffer()
        self.taken: list[dict[str, float]] = []  # per snapshot: step, seconds it held the loop
        self.size = 0
        self._ready()

    def restore(self, disk_step: int) -> int | None:
        """At an in-job restart: load the newest snapshot every rank can get when newer than the
        newest disk checkpoint; its step, or None (then the disk checkpoint loads). A state whose
        step is not the one its signed header names loads nowhere."""
        t = time.perf_counter()
        got = self.exchange.get(newer_than=disk_step) if self.every != 0 else None
        if got is None:
            return None
        try:
            saved = thaw(got[1])
        except ValueError:
            saved = None
        ok = isinstance(saved, dict) and saved.get("step") == got[0]
        if not self.exchange.agree_all(ok) or not isinstance(saved, dict):
            return None
        step = self.apply(saved)
        if self.exchange.rank == 0:
            self.log(
                f"resumed from the in-memory snapshot of step {step} in {time.perf_counter() - t:.2f}s"
            )
        return step

    def _ready(self) -> None:
        """Every rank's folder private and the job key there, else snapshots off for the run: one
        line and one `snapshots_off` event (rank 0), never a failure."""
        whys = self.exchange.gather((self.exchange.unsafe or "").encode())
        why = next((w.decode(errors="replace") for w in whys if w), None)
        self.every = self.every if why is None else 0
        if why is not None and self.exchange.rank == 0:
            self.log(f"snapshots off: {why}; in-job restarts load the disk checkpoint")
            with contextlib.suppress(Exception):  # an event never fails the run
                run = RunFolder(jobenv.get(jobenv.RUN_DIR) or self.run_dir)
                run.event("snapshots_off", reason=why, job_id=jobenv.get(jobenv.JOB_ID))

    def step(self, step: int, *, saved: bool) -> None:
        """At every step boundary (every rank): take a snapshot when one is due. `saved`: a disk
        checkpoint of this step was written (then a snapshot of it would add nothing)."""
        now = time.perf_counter()
        if self._last is not None:
            self._step_s.append(now - self._last)
        if self.every == 0 or (self.auto and len(self._step_s) < 3):
            self._last = time.perf_counter()
            return
        if self.every is None and len(self.taken) >= CALIBRATE:
            self._wait()  # the last one's thread time known
            self._calibrate()
        if (self.every is None or step % self.every == 0) and not saved:
            self._take(step)
        self._last = time.perf_counter()

    def _calibrate(self) -> None:
        """Auto: the intervals from the median costs so far, agreed by every rank, planned within
        AIM of the budget. On a GPU node the thread runs beside the step: the loop's copy is the
        cost, both copies go at every snapshot. On a CPU node the thread's work comes out of
        training: the own copy (the loop's copy and its write) gets up to store.OWN_SHARE of the budget,
        the partner's (the exchange, timed whole) the rest, at a multiple of that interval."""
        cpu = not (torch.cuda.is_available() and torch.cuda.is_initialized())  # type: ignore[no-untyped-call]
        warm = self.taken[1:] or self.taken
        own = median_high([t["blocked_s"] + (t["own_s"] if cpu else 0.0) for t in warm])
        partner = median_high([t["partner_s"] for t in warm if t["sent"]] or [0.0])
        own, partner, step_s = self.exchange.agree_max(own, partner, median_high(self._step_s))
        before = (self.every, self.partner_every)
        self.every, self.partner_every = intervals(
            own, partner if cpu else 0.0, AIM * self.budget * max(step_s, 1e-9)
        )
        if self.exchange.rank == 0 and before != (self.every, self.partner_every):
            them = (
                f"; the partner's copy every {self.partner_every} ({partner * 1e3:.1f} ms each)"
                if self.partner_every
                else ""
            )
            self.log(
                f"snapshots in memory every {self.every} step(s): {self.size / 2**20:.1f} MiB "
                f"per rank, {own * 1e3:.1f} ms each, {AIM * self.budget:.1%} of a "
                f"{step_s * 1e3:.1f} ms step{them}"
            )

    def _take(self, step: int) -> None:
        t = time.perf_counter()
        self._wait()
        data = freeze(self.payload(), self._buf)  # the last one's buffer, stored by now
        if not self.taken and not self._fits(len(data)):
            self.every = 0
            return
        self.size = len(data)
        send = (
            self.partner_every is None
            or len(self.taken) < CALIBRATE  # its cost measured
            or step % self.partner_every == 0
        )
        row = {"step": step, "blocked_s": time.perf_counter() - t, "sent": float(send)}
        row |= {"own_s": 0.0, "partner_s": 0.0}  # the thread's, once stored
        self._put = threading.Thread(
            target=self._store, args=(step, data, send, row), name="hpctrain-snapshot", daemon=True
        )
        self._put.start()
        self.taken.append(row)

    def _store(self, step: int, data: memoryview, send: bool, row: dict[str, float]) -> None:
        try:
            row["own_s"], row["partner_s"] = self.exchange.put(step, data, send)
        except BaseException as e:  # the loop's next wait raises it, as if put had run there
            self._failed = e
        if self.exchange.failed and not self._said:  # once (train.log holds rank 0's lines)
            self._said = True
            self.log(f"a snapshot was not kept (training goes on): {self.exchange.failed}")

    def _wait(self) -> None:
        if self._put is not None:
            self._put.join()
            self._put = None
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed

    def _fits(self, size: int) -> bool:
        """The plan, at the first snapshot (every rank agrees): KEEP steps of this node's ranks
        and of their partners' copies within MEMORY_SHARE of the node folder's free memory."""
        ex = self.exchange
        local = int(os.environ.get("LOCAL_WORLD_SIZE") or ex.world)
        need = store.node_bytes(size, ranks_per_node=local, partner=ex.partner is not None)
        free = store.free_bytes(ex.folder)
        ok = ex.agree_all(need <= MEMORY_SHARE * free)
        if not ok and ex.rank == 0:
            self.log(
                f"snapshots off: {need / 2**20:.0f} MiB per node planned, more than "
                f"{MEMORY_SHARE:.0%} of the {free / 2**20:.0f} MiB free in {store.base()} on some "
                f"node; in-job restarts load the disk checkpoint (set {jobenv.SNAPSHOT_DIR} to a "
                "larger node-local memory folder, or --snapshot.every_steps=0 to say so)"
            )
        return ok

    def close(self) -> None:
        """At the run's end (done or preempted, its disk checkpoint saved): free the memory. A
        failed last snapshot is no error here (another rank's close may have removed its folder)."""
        with contextlib.suppress(Exception):
            self._wait()
        store.clean(self.run_dir)
