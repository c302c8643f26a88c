"""A plain hand-written DeepSpeed loop, as DeepSpeed's getting-started guide writes it: the baseline
for train_entry's deepspeed strategy (same ZeRO stage, batch, precision and torch AdamW).

    DS_ACCELERATOR=cpu python -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/baselines/plain_deepspeed.py --max-steps 40 --out steps.json
"""

import argparse
import sys
from pathlib import Path

import deepspeed
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import demo  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--max-steps", type=int, required=True)
ap.add_argument("--out", required=True)
args = ap.parse_args()

demo.no_deepspeed_builds()
deepspeed.init_distributed(dist_backend="gloo")
d = demo.build()
opt = d.optimizer(d.model.parameters())
engine, _, _, sched = deepspeed.initialize(
    model=d.model, optimizer=opt, lr_scheduler=d.scheduler(opt), config=d.deepspeed_config()
)
sampler: DistributedSampler[demo.Batch] = DistributedSampler(
    d.dataset, shuffle=True, seed=d.seed, drop_last=True
)
loader = DataLoader(
    d.dataset, batch_size=d.micro_batch, sampler=sampler, drop_last=True, collate_fn=d.collate
)
batches = demo.forever(loader, sampler)

clock = demo.StepClock()
for _step in range(args.max_steps):
    for _micro in range(d.accum):
        loss = d.loss(engine, next(batches))
        engine.backward(loss)
        engine.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
    loss.item()
    clock.tick()
clock.write(args.out)
