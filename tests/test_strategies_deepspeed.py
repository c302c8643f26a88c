"""DeepSpeed ZeRO-1, 2, 3 and 3 with CPU offload train, in one torchrun launch (start-up is the cost).

The launched script is this file's __main__: it uses train_entry as a library (the way a user with their
own loop would: init_distributed, load_config, wrap, compute_loss) and prints one JSON line per variant.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.kernel import jobenv

REPO = Path(__file__).resolve().parent.parent
STEPS = 30
VARIANTS = {
    "zero1": ["--deepspeed.zero_stage=1"],
    "zero2-accum2": [
        "--deepspeed.zero_stage=2",
        "--train.micro_batch=4",
    ],  # accumulation in the engine
    "zero2-bf16": ["--deepspeed.zero_stage=2", "--train.precision=bf16"],
    "zero3": ["--deepspeed.zero_stage=3"],
    "zero3-offload": [
        "--deepspeed.zero_stage=3",
        "--deepspeed.offload_optimizer=cpu",
        "--deepspeed.offload_param=cpu",
    ],
}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_zero_stages_and_offload_train():
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith((jobenv.PREFIX, "RANK", "WORLD_SIZE"))
    }
    env.update(
        OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", **{jobenv.DEVICE: "cpu"}, PYTHONPATH=str(REPO)
    )
    res = subprocess.run(
        [
            str(Path(sys.executable).parent / "torchrun"),
            "--standalone",
            "--nproc-per-node",
            "2",
            __file__,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=280,
    )
    assert res.returncode == 0, res.stdout + res.stderr[-4000:]
    rows = {
        r["variant"]: r
        for r in map(json.loads, (line for line in res.stdout.splitlines() if line.startswith("{")))
    }
    assert sorted(rows) == sorted(VARIANTS)
    for name, r in rows.items():
        assert r["last"] < 0.9 * r["first"], f"{name}: loss {r['first']:.3f} -> {r['last']:.3f}"
        print(f"\n{name}: loss {r['first']:.3f} -> {r['last']:.3f}, {r['steps_per_s']:.1f} steps/s")
    assert rows["zero3"]["stage"] == 3 and rows["zero1"]["stage"] == 1
    assert rows["zero3-offload"]["offload_optimizer"] == "cpu"
    assert rows["zero3-offload"]["offload_param"] == "cpu"
    assert rows["zero2-accum2"]["accum"] == 2 and rows["zero2-bf16"]["dtype"] == "torch.bfloat16"


def main() -> None:
    import time

    import torch

    from train_entry import build_batches, compute_loss, init_distributed, load_config, wrap
    from train_entry.config import check_sizes
    from train_entry.trainer import to_device

    for name, overrides in VARIANTS.items():
        cfg = load_config(
            None,
            ["--strategy=deepspeed", f"--train.max_steps={STEPS}", "--optim.lr=5e-3", *overrides],
        )
        accum = check_sizes(cfg)
        info = init_distributed(seed=cfg.train.seed)
        from train_entry.model import build_model

        model = build_model(cfg, rank=info.rank, world_size=info.world_size)
        batches = build_batches(cfg, rank=info.rank, world_size=info.world_size)
        w = wrap(model, cfg=cfg, device=info.device, grad_accum=accum)
        losses, t0 = [], 0.0
        for step in range(STEPS):
            if step == 5:
                t0 = time.perf_counter()
            total = 0.0
            for micro in range(accum):
                batch = to_device(next(batches), w.model.device)
                with w.sync(micro == accum - 1), w.autocast():
                    loss = compute_loss(w.model, batch)
                    w.backward(loss)
                total += loss.item() / accum
            w.step()
            losses.append(total)
        rate = (STEPS - 5) / (time.perf_counter() - t0)
        zero = w.model.zero_optimization_stage()
        conf = w.extra["ds_config"]["zero_optimization"]
        if info.rank == 0:
            print(
                json.dumps(
                    {
                        "variant": name,
                        "first": sum(losses[:5]) / 5,
                        "last": sum(losses[-5:]) / 5,
                        "stage": zero,
                        "accum": w.model.gradient_accumulation_steps(),
                        "dtype": str(next(w.model.module.parameters()).dtype),
                        "offload_optimizer": conf.get("offload_optimizer", {}).get("device"),
                        "offload_param": conf.get("offload_param", {}).get("device"),
                        "steps_per_s": rate,
                    }
                ),
                flush=True,
            )
        del w, model
        torch.distributed.barrier()


if __name__ == "__main__":
    from train_entry.dist import exit_now

    main()
    exit_now(0)
