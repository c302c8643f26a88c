"""The plain loops train_entry is measured against, as the PyTorch, Accelerate and DeepSpeed guides
write them: each builds its own copy of the demo model, data and optimizer (benchmarks/demo.py:
train_entry's own config and factories) and returns one optimizer step as a function, which
ends in `loss.item()` as the guides' loops do.

They run inside train_entry's own processes (benchmarks/workers/paired.py), their segments
alternating with train_entry's: the process group is train_entry's, already set up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.utils.data import DataLoader, DistributedSampler

from benchmarks import demo

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    from train_entry.model import GPT

Step = Callable[[], None]


def _loader(d: demo.Demo, dp: DeviceMesh | None = None) -> Iterator[demo.Batch]:
    """The demo data through a DataLoader with a shuffled DistributedSampler (over the "dp"
    dimension of a mesh: its peers in other dimensions read the same shard)."""
    where = {} if dp is None else {"num_replicas": dp.size(), "rank": dp.get_local_rank()}
    sampler: DistributedSampler[demo.Batch] = DistributedSampler(
        d.dataset, shuffle=True, seed=d.seed, drop_last=True, **where
    )
    loader = DataLoader(
        d.dataset, batch_size=d.micro_batch, sampler=sampler, drop_last=True, collate_fn=d.collate
    )
    return demo.forever(loader, sampler)


def _update(
    d: demo.Demo,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LambdaLR | None,
) -> None:
    if d.clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), d.clip)
    opt.step()
    if sched:
        sched.step()
    opt.zero_grad(set_to_none=True)


def plain_ddp() -> Step:
    """DDP(model) with torch's defaults, no_sync on the micro-steps before the last."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    d = demo.build()
    model = DDP(d.model)
    opt = d.optimizer(model.parameters())
    sched = d.scheduler(opt)
    batches = _loader(d)

    def step() -> None:
        for micro in range(d.accum):
            sync = micro == d.accum - 1
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = d.loss(model, next(batches)) / d.accum
                loss.backward()
        _update(d, model, opt, sched)
        loss.item()

    return step


def plain_fsdp() -> Step:
    """FSDP2 as its tutorial writes it: fully_shard per block, then the root."""
    from torch.distributed.fsdp import fully_shard

    d = demo.build()
    model = d.model
    for block in d.blocks(model):
        fully_shard(block)
    fsdp = fully_shard(model)  # the same module, typed with FSDP2's methods
    opt = d.optimizer(model.parameters())
    sched = d.scheduler(opt)
    batches = _loader(d)

    def step() -> None:
        for micro in range(d.accum):
            fsdp.set_requires_gradient_sync(micro == d.accum - 1)
            loss = d.loss(model, next(batches)) / d.accum
            loss.backward()
        _update(d, model, opt, sched)
        loss.item()

    return step


def plain_deepspeed() -> Step:
    """deepspeed.initialize with the getting-started config (ZeRO stage and clipping as
    train_entry's), torch AdamW as a client optimizer; engine.backward / engine.step."""
    import deepspeed

    demo.no_deepspeed_builds()
    d = demo.build()
    opt = d.optimizer(d.model.parameters())
    engine, _, _, _ = deepspeed.initialize(
        model=d.model, optimizer=opt, lr_scheduler=d.scheduler(opt), config=d.deepspeed_config()
    )
    batches = _loader(d)

    def step() -> None:
        for _micro in range(d.accum):
            loss = d.loss(engine, next(batches))
            engine.backward(loss)
            engine.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
        loss.item()

    return step


def accelerate() -> Step:
    """Accelerate's loop: prepare (DDP with torch's defaults, its own sharded loader of the same
    data), accumulate(), accelerator.backward / clip_grad_norm_."""
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=1, cpu=True)
    d = demo.build()
    accelerator.gradient_accumulation_steps = d.accum
    opt = d.optimizer(d.model.parameters())
    sched = d.scheduler(opt)
    # The global batch is train_entry's: Accelerate shards this loader across the ranks.
    loader = DataLoader(
        d.dataset, batch_size=d.micro_batch, shuffle=True, drop_last=True, collate_fn=d.collate
    )
    model, opt, loader, sched = accelerator.prepare(d.model, opt, loader, sched)
    batches = demo.forever(loader)

    def step() -> None:
        while True:
            with accelerator.accumulate(model):
                loss = d.loss(model, next(batches))
                accelerator.backward(loss)
                if accelerator.sync_gradients and d.clip:
                    accelerator.clip_grad_norm_(model.parameters(), d.clip)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
            if accelerator.sync_gradients:
                loss.item()
                return

    return step


def plain_tp() -> Step:
    """Tensor parallel as the PyTorch TP tutorial and torchtitan write it: a ("dp", "tp") mesh,
    Megatron's plan with parallelize_module (attention and MLP as colwise then rowwise pairs,
    sequence-parallel norms, vocabulary-parallel embedding and logits, the loss under
    loss_parallel), then fully_shard of every block and the root over "dp"; tp peers read the same
    data shard."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        loss_parallel,
        parallelize_module,
    )

    from train_entry.model import GPT

    d = demo.build()
    tp = d.cfg.parallel.tp
    mesh = init_device_mesh("cpu", (dist.get_world_size() // tp, tp), mesh_dim_names=("dp", "tp"))
    model = d.model
    assert isinstance(model, GPT)  # the plan below names the demo GPT's layers
    top = {
        "tok": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "pos": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
        "ln_f": SequenceParallel(),
        "head": ColwiseParallel(
            input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False
        ),
    }
    parallelize_module(model, mesh["tp"], top)
    for block in model.blocks:
        plan = {
            "ln1": SequenceParallel(),
            "qkv": ColwiseParallel(input_layouts=Shard(1)),
            "proj": RowwiseParallel(output_layouts=Shard(1)),
            "ln2": SequenceParallel(),
            "mlp.0": ColwiseParallel(input_layouts=Shard(1)),
            "mlp.2": RowwiseParallel(output_layouts=Shard(1)),
        }
        parallelize_module(block, mesh["tp"], plan)
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fsdp = fully_shard(model, mesh=mesh["dp"])  # the same module, typed with FSDP2's methods
    opt = d.optimizer(model.parameters())
    sched = d.scheduler(opt)
    batches = _loader(d, mesh["dp"])

    def step() -> None:
        for micro in range(d.accum):
            fsdp.set_requires_gradient_sync(micro == d.accum - 1)
            with loss_parallel():
                loss = d.loss(model, next(batches)) / d.accum
                loss.backward()
        _update(d, model, opt, sched)
        loss.full_tensor().item() if hasattr(loss, "full_tensor") else loss.item()

    return step


class Stage(torch.nn.Module):
    """Layers [lo, hi) of the demo GPT: the first stage also the embeddings, the last the final
    norm and the head."""

    def __init__(self, gpt: GPT, lo: int, hi: int, first: bool, last: bool) -> None:
        super().__init__()
        self.tok: torch.nn.Module | None = gpt.tok if first else None
        self.pos: torch.nn.Module | None = gpt.pos if first else None
        self.blocks = torch.nn.ModuleList(gpt.blocks[lo:hi])
        self.ln_f: torch.nn.Module | None = gpt.ln_f if last else None
        self.head: torch.nn.Module | None = gpt.head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None and self.pos is not None:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        for block in self.blocks:
            x = block(x)
        if self.head is not None and self.ln_f is not None:
            x = self.head(self.ln_f(x)).float()
        return x


@dataclass
class Pipeline:
    """One rank's pipeline as the torch.distributed.pipelining tutorial and torchtitan set it up:
    a ("pp", "dp") mesh, rank r of "pp" keeps layers [r L/p, (r+1) L/p), fully_shard of its
    blocks and the stage over "dp", one PipelineStage."""

    d: demo.Demo
    mesh: DeviceMesh
    stage: PipelineStage
    fsdp: FSDPModule
    params: list[torch.nn.Parameter]
    rank: int
    p: int

    @classmethod
    def build(cls) -> Pipeline:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.pipelining import PipelineStage

        d = demo.build()
        p = d.cfg.parallel.pp
        mesh = init_device_mesh("cpu", (p, dist.get_world_size() // p), mesh_dim_names=("pp", "dp"))
        rank = mesh["pp"].get_local_rank()
        from train_entry.model import GPT

        gpt = d.model
        assert isinstance(gpt, GPT)  # the stages take the demo GPT's layers
        per = len(gpt.blocks) // p
        mod = Stage(gpt, rank * per, (rank + 1) * per, rank == 0, rank == p - 1)
        for block in mod.blocks:
            fully_shard(block, mesh=mesh["dp"])
        fsdp = fully_shard(mod, mesh=mesh["dp"])  # the same module, typed with FSDP2's methods
        stage = PipelineStage(mod, rank, p, torch.device("cpu"), group=mesh["pp"].get_group())
        return cls(d, mesh, stage, fsdp, list(mod.parameters()), rank, p)

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        flat = F.cross_entropy(out.flatten(0, 1), target.flatten(), ignore_index=-100)
        return flat / self.d.accum

    def schedule(self, microbatches: int, kind: str = "1f1b") -> PipelineScheduleSingle:
        from torch.distributed import pipelining

        cls = pipelining.ScheduleGPipe if kind == "gpipe" else pipelining.Schedule1F1B
        return cls(self.stage, n_microbatches=microbatches, loss_fn=self.loss)

    def run(self, schedule: PipelineScheduleSingle, batch: demo.Batch) -> None:
        """One pass of the schedule over a batch: forward and backward of its micro-batches."""
        if self.rank == 0:
            schedule.step(batch["idx"])
        elif self.rank == self.p - 1:
            schedule.step(target=batch["targets"], losses=[])
        else:
            schedule.step()


def plain_pp() -> Step:
    """Pipeline parallel: 1F1B with pp micro-batches per micro-step; the gradient norm's squares
    are summed over "pp" for the clip."""
    import torch.distributed as dist

    pipe = Pipeline.build()
    d, params = pipe.d, pipe.params
    schedule = pipe.schedule(pipe.p)
    opt = d.optimizer(params)
    sched = d.scheduler(opt)
    batches = _loader(d, pipe.mesh["dp"])

    def step() -> None:
        for micro in range(d.accum):
            pipe.fsdp.set_requires_gradient_sync(micro == d.accum - 1)
            pipe.run(schedule, next(batches))
        if d.clip:
            grads = [q.grad for q in params if q.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads, foreach=True)
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            norm = norm**2
            dist.all_reduce(norm, group=pipe.mesh["pp"].get_group())
            torch.nn.utils.clip_grads_with_norm_(params, d.clip, norm.sqrt(), foreach=True)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)

    return step


LOOPS: dict[str, Callable[[], Step]] = {
    "plain_ddp": plain_ddp,
    "plain_ddp_2": plain_ddp,  # a second copy: the A/A of the method
    "plain_fsdp": plain_fsdp,
    "plain_fsdp_2": plain_fsdp,  # a second copy: FSDP2's own A/A
    "plain_deepspeed": plain_deepspeed,
    "accelerate": accelerate,
    "plain_tp": plain_tp,
    "plain_pp": plain_pp,
}
