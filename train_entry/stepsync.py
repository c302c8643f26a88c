"""One collective per optimizer step, and the loop never waits for it.

At every step boundary the trainer needs two things from all ranks: the loss averaged over ranks
(for metrics.jsonl) and whether any rank wants to stop (preemption). Two blocking all-reduces would
add two synchronisation points per step, and on a loaded machine each costs the time the slower rank
takes to arrive. Here both go into one small tensor, [loss sum, stop votes, GPU memory per rank],
summed by one all-reduce launched with `async_op=True` at the end of step N and collected at the
end of step N+1: by then every rank has long contributed (its step N+1 gradients went through the
same process group after it), so collecting does not wait.

What that changes, and why it stays exact:
  - step N's metrics line is written at the end of step N+1, with step N's completion time;
  - a stop vote cast at the end of step N is seen by every rank at the end of step N+1, from the
    same reduced tensor, so every rank stops and saves the same step (N+1), and no step is redone.
    A stop every rank knows on its own (STOP_AT_STEP, or a single process) stops at once.
At a stop and at the last step the reduction of that step is done at once (`now`), so its metrics
line is written before the checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

_GIB = 2**30


@dataclass
class Boundary:
    """What one rank knows at the end of an optimizer step; `loss`, `votes` and `memory` are the
    reduced values once collected."""

    step: int
    loss_sum: torch.Tensor  # this rank's summed micro-step losses (a 0-d tensor on the device)
    grad_norm: float
    lr: float
    vote: bool  # this rank wants to stop
    log: bool  # a metrics step (train.log_every)
    wall: float = field(default_factory=time.time)  # the step's completion time
    perf: float = field(default_factory=time.perf_counter)
    loss: float = float("nan")  # the summed loss over ranks and micro-steps
    votes: int = 0  # how many ranks want to stop
    memory: dict[str, list[float]] = field(default_factory=dict)  # GPU memory per rank (CUDA only)


class StepSync:
    """`launch(b)` at a boundary, `collect()` at the next; `now(b)` when the answer is needed now."""

    def __init__(self, device: torch.device, *, rank: int, world_size: int) -> None:
        self.device, self.rank, self.world = device, rank, world_size
        self.distributed = world_size > 1 and dist.is_available() and dist.is_initialized()
        self.cuda = device.type == "cuda"
        self._pending: tuple[Boundary, torch.Tensor, dist.Work | None] | None = None

    def _pack(self, b: Boundary) -> torch.Tensor:
        n = 2 + (3 * self.world if self.cuda else 0)
        buf = torch.zeros(n, dtype=torch.float32, device=self.device)
        if b.log:
            buf[0] = b.loss_sum.detach().float()  # stays on the device: no host sync
        buf[1] = 1.0 if b.vote else 0.0
        if self.cuda and b.log:
            mem = [
                torch.cuda.memory_allocated(self.device) / _GIB,
                torch.cuda.memory_reserved(self.device) / _GIB,
                torch.cuda.max_memory_allocated(self.device) / _GIB,
            ]
            at = 2 + 3 * self.rank  # every rank its own slot: the sum is a gather
            buf[at : at + 3] = torch.tensor(mem, dtype=torch.float32, device=self.device)
        return buf

    def _unpack(self, b: Boundary, buf: torch.Tensor) -> Boundary:
        vals = buf.tolist()
        b.loss, b.votes = vals[0], round(vals[1])
        if self.cuda and b.log:
            rows = [vals[2 + 3 * r : 5 + 3 * r] for r in range(self.world)]
            b.memory = {
                "mem_allocated_gib": [round(r[0], 3) for r in rows],
                "mem_reserved_gib": [round(r[1], 3) for r in rows],
                "mem_peak_gib": [round(r[2], 3) for r in rows],
            }
        return b

    def launch(self, b: Boundary) -> None:
        """Start the reduction of `b` (every rank, same order); `collect()` returns it."""
        assert self._pending is None, "collect() the previous boundary first"
        buf = self._pack(b)
        work = (
            dist.all_reduce(buf, op=dist.ReduceOp.SUM, async_op=True) if self.distributed else None
        )
        self._pending = (b, buf, work)

    def collect(self) -> Boundary | None:
        """The boundary launched last, reduced; None when nothing is pending."""
        if self._pending is None:
            return None
        b, buf, work = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        return self._unpack(b, buf)

    def now(self, b: Boundary) -> Boundary:
        """Reduce `b` at once (after collecting what is pending)."""
        self.launch(b)
        done = self.collect()
        assert done is not None
        return done
