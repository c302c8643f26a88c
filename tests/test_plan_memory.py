"""plan's model-state bytes per rank against what each strategy really holds, on CPU with 2 ranks.

One torchrun launch of this file (2 gloo ranks) builds a small model under every strategy, takes two
optimizer steps, and between the second backward and step (the model-state peak: parameters,
gradients and optimizer state all alive) counts every tensor storage the process holds, minus what
existed before the model was built. Tensors that only C++ holds (a grad without a Python object) are
reached through their parameter's `.grad`.

    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node 2 \\
        tests/test_plan_memory.py OUT.json
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HIDDEN, FFN, LAYERS = 256, 1024, 4
# (name in plan, precision, optimizer)
CASES = [
    ("ddp", "fp32", "adamw"),
    ("ddp", "fp32", "sgd-momentum"),
    ("fsdp", "fp32", "adamw"),
    ("fsdp", "bf16", "adamw"),
    ("fsdp_offload", "fp32", "adamw"),
    ("zero1", "fp32", "adamw"),
    ("zero2", "fp32", "adamw"),
    ("zero3", "fp32", "adamw"),
    ("zero1", "bf16", "adamw"),
    ("zero2", "bf16", "adamw"),
    ("zero3", "bf16", "adamw"),
    ("zero2_offload", "fp32", "adamw"),
    ("zero3_offload", "bf16", "adamw"),
    ("zero3_offload_params", "fp32", "adamw"),
]


def _census(torch, exclude: frozenset[int] = frozenset()) -> dict[int, int]:
    """storage address -> bytes, for every CPU tensor storage reachable from Python."""
    tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    tensors += [t.grad for t in tensors if t.is_leaf and t.requires_grad and t.grad is not None]
    seen: dict[int, int] = {}
    for t in tensors:
        try:
            if t.device.type == "meta":
                continue
            st = t.untyped_storage()
            ptr = st.data_ptr()
        except (RuntimeError, NotImplementedError):  # DTensor wrappers, freed storages
            continue
        if ptr and ptr not in exclude:
            seen[ptr] = max(seen.get(ptr, 0), st.nbytes())
    return seen


def _model(torch):
    nn = torch.nn
    torch.manual_seed(0)
    return nn.Sequential(
        *[
            nn.Sequential(nn.Linear(HIDDEN, FFN), nn.GELU(), nn.Linear(FFN, HIDDEN))
            for _ in range(LAYERS)
        ]
    )


def _measure(torch, name: str, precision: str, optimizer: str) -> tuple[int, int, int]:
    """(parameters, largest parameter's elements, bytes held per rank at the model-state peak)."""
    before = frozenset(_census(torch))
    model = _model(torch)
    params = sum(p.numel() for p in model.parameters())
    largest = max(p.numel() for p in model.parameters())
    x = torch.randn(2, HIDDEN)
    low = torch.bfloat16 if precision == "bf16" else None

    def make_opt(ps):
        if optimizer == "adamw":
            return torch.optim.AdamW(ps, lr=1e-3)
        return torch.optim.SGD(ps, lr=1e-3, momentum=0.9)

    if name == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        mod = DDP(model, gradient_as_bucket_view=True)
        opt = make_opt(mod.parameters())

        def step(probe):
            mod(x).square().mean().backward()
            held = probe()
            opt.step()
            opt.zero_grad()
            return held
    elif name.startswith("fsdp"):
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)}
        if name == "fsdp_offload":
            kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
        for block in model:
            fully_shard(block, **kw)
        fully_shard(model, **kw)
        opt = make_opt(model.parameters())

        def step(probe):
            model(x).float().square().mean().backward()
            held = probe()
            opt.step()
            opt.zero_grad()
            return held
    else:
        import deepspeed

        from hpctrain.plan import BY_NAME

        lay = BY_NAME[name]
        zero = {
            "stage": lay.zero_stage,
            "reduce_bucket_size": 20000,
            "allgather_bucket_size": 20000,
            "stage3_prefetch_bucket_size": 20000,
            "stage3_param_persistence_threshold": 0,
            "stage3_max_live_parameters": 20000,
        }
        if lay.offload in ("optimizer", "optimizer+params"):
            zero["offload_optimizer"] = {"device": "cpu"}
        if lay.offload == "optimizer+params":
            zero["offload_param"] = {"device": "cpu"}
        cfg = {
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 1,
            "zero_optimization": zero,
            "zero_allow_untested_optimizer": True,
            "zero_force_ds_cpu_optimizer": False,
            "bf16": {"enabled": low is not None},
        }
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=make_opt(model.parameters()), config=cfg
        )
        xin = x.to(low) if low is not None else x

        def step(probe):
            engine.backward(engine(xin).float().square().mean())
            held = probe()
            engine.step()
            return held

    step(lambda: None)  # the first step creates the optimizer state
    held = step(lambda: sum(_census(torch, before).values()))
    return params, largest, held


def _worker(out: str) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch
    import torch.distributed as dist

    # no C++ build on a machine without a compiler (../shared/notes/cpu-distributed.md)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    rows = []
    for name, precision, optimizer in CASES:
        # What is alive now (torch, DeepSpeed, what the cases before left) existed before this
        # model: frozen, it is out of the census and of gc.collect, which walked its ~280k
        # objects 42 times (half this launch's CPU time).
        gc.collect()
        gc.freeze()
        params, largest, held = _measure(torch, name, precision, optimizer)
        rows.append(
            {
                "name": name,
                "precision": precision,
                "optimizer": optimizer,
                "params": params,
                "largest": largest,
                "held": held,
            }
        )
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, rows)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"world": dist.get_world_size(), "ranks": everyone}))


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("plan") / "held.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            __file__,
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    "name,precision,optimizer", CASES, ids=[f"{n}-{p}-{o}" for n, p, o in CASES]
)
def test_predicted_model_state_matches_held_bytes(measured, name, precision, optimizer):
    from hpctrain.plan import BY_NAME, model_state

    world = measured["world"]
    for rank, rows in enumerate(measured["ranks"]):
        row = next(
            r
            for r in rows
            if (r["name"], r["precision"], r["optimizer"]) == (name, precision, optimizer)
        )
        p, g, o, host = model_state(
            BY_NAME[name],
            params=row["params"],
            world=world,
            precision=precision,
            optimizer=optimizer,
            largest=row["largest"],
        )
        # On CPU the "device" and the host are the same memory: offload moves bytes, not removes them.
        predicted = p + g + o + host
        assert predicted > 0
        assert abs(row["held"] - predicted) <= 0.05 * predicted, (
            f"rank {rank} {name} {precision} {optimizer}: plan predicts {predicted:,} bytes, "
            f"the strategy holds {row['held']:,} ({row['held'] / predicted:.3f}x)"
        )


if __name__ == "__main__":
    from train_entry.dist import exit_now

    _worker(sys.argv[1])
    exit_now(0)
