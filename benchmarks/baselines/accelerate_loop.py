"""Hugging Face Accelerate driving the same model, as Accelerate's quick tour writes it: the peer
train_entry's DDP is compared with.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        benchmarks/baselines/accelerate_loop.py --max-steps 40 --out steps.json
"""

import argparse
import sys
from pathlib import Path

from accelerate import Accelerator
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import demo  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--max-steps", type=int, required=True)
ap.add_argument("--out", required=True)
args = ap.parse_args()

accelerator = Accelerator(gradient_accumulation_steps=1, cpu=True)
d = demo.build()
accelerator.gradient_accumulation_steps = d.accum
opt = d.optimizer(d.model.parameters())
sched = d.scheduler(opt)
# The global batch is the same as train_entry's: Accelerate shards this loader across ranks.
loader = DataLoader(
    d.dataset, batch_size=d.micro_batch, shuffle=True, drop_last=True, collate_fn=d.collate
)
if sched:
    model, opt, loader, sched = accelerator.prepare(d.model, opt, loader, sched)
else:
    model, opt, loader = accelerator.prepare(d.model, opt, loader)
batches = demo.forever(loader)

clock = demo.StepClock()
step = 0
while step < args.max_steps:
    with accelerator.accumulate(model):
        loss = d.loss(model, next(batches))
        accelerator.backward(loss)
        if accelerator.sync_gradients:
            if d.clip:
                accelerator.clip_grad_norm_(model.parameters(), d.clip)
        opt.step()
        if sched:
            sched.step()
        opt.zero_grad(set_to_none=True)
    if accelerator.sync_gradients:
        loss.item()
        step += 1
        clock.tick()
clock.write(args.out)
accelerator.end_training()
