"""`python -m hpctrain.service.sweep_runner SWEEP_DIR`: the local profile's stand-in for a job array.

Started detached by `hpctrain sweep` (its own session, output in SWEEP_DIR/logs/runner.log). Starts
each point's job.sh through the local executor, at most `max_parallel` at a time, in index order,
and exits when every point has been started and has ended. TERM (from `hpctrain cancel SWEEP`)
stops it starting more points; the running ones are cancelled by the caller.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from hpctrain import dispatch
from hpctrain.profiles import schema
from hpctrain.runs import sweepdir
from hpctrain.runs.folder import TERMINAL, RunDir
from hpctrain.service import points, sweep


def main(sweep_dir: Path) -> int:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    data = sweepdir.read(sweep_dir)
    limit = max(1, int(data.get("max_parallel") or 1))
    waiting = [
        RunDir(sweep_dir / r.point) for r in points.table(sweep_dir) if r.state in sweep.RESUMABLE
    ]  # first start: every point WAITING
    running: list[RunDir] = []
    while (waiting or running) and not stop:
        running = [r for r in running if dispatch.state(r) not in TERMINAL]
        while waiting and len(running) < limit and not stop:
            run = waiting.pop(0)
            rec = run.record()
            profile = schema.Profile.model_validate(rec.profile)
            job_id = dispatch.submit(run, profile, time_min=rec.time_min or 60, kind=sweepdir.KIND)
            print(f"started point {run.name}: job {job_id}", flush=True)
            running.append(run)
        time.sleep(1)
    print("stopped (cancel)" if stop else "every point has ended", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
