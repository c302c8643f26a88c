"""An unchanged Accelerate script (no hpctrain code): what world does Accelerator() see?

Writes <out>/rank-<process_index>.json with the processes it counts and the result of a gather.
"""

import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

acc = Accelerator()
gathered = acc.gather(torch.tensor([acc.process_index])).tolist()
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
info = {
    "num_processes": acc.num_processes,
    "process_index": acc.process_index,
    "device": str(acc.device),
    "distributed_type": str(acc.distributed_type),
    "gathered": gathered,
}
(out / f"rank-{acc.process_index}.json").write_text(json.dumps(info))
print("accelerate:", json.dumps(info), flush=True)
acc.wait_for_everyone()
