"""An unchanged script that knows nothing of hpctrain's stop flag: it works STEPS x SLEEP seconds and
leaves with 0. `hpctrain preempt` during it must end the run COMPLETED with one start, never a
requeue (tests/test_finished_runs.py). Rank 0 writes OUT/started first, so the test knows when.

    python ignores_stop.py OUT [STEPS] [SLEEP]
"""

import os
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
sleep = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
rank = int(os.environ.get("RANK", "0"))
out.mkdir(parents=True, exist_ok=True)
if rank == 0:
    (out / "started").write_text(f"{time.time()}\n")
for step in range(1, steps + 1):
    time.sleep(sleep)
    print(f"step {step}/{steps}", flush=True)
(out / f"done-{rank}").write_text(f"{steps}\n")
