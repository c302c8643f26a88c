"""4. Preemption: optimizer steps redone after a signal preemption (target 0) and after SIGKILL
(target <= the checkpoint interval).

torchrun (2 ranks, DDP, the demo GPT, a checkpoint every C steps) trains; at a step that is not a
multiple of C it is
  - preempted the way hpctrain's batch script relays the scheduler's signal: its trap touches
    the STOP file (the job environment's STOP_FILE), the ranks agree, save and exit 75; or
  - sent SIGTERM, torchrun and every worker at once, as Slurm does on scancel (target 0 too); or
  - killed: SIGKILL to torchrun and every worker at once (a node lost, the OOM killer);
then the same command is started again and resumes by itself. Steps redone = the last step the first
run logged in metrics.jsonl minus the step the second run resumed from (its first step - 1).
The figure is the worst over the repetitions.
"""

from __future__ import annotations

import random
import signal
import time
from typing import TypedDict

from benchmarks import common
from benchmarks.restart import train_entry
from hpctrain.kernel import jobenv

EVERY = 5


class Trial(TypedDict):
    stopped_at_step: int
    last_logged_step: int
    resumed_from_step: int
    redone: int
    first_run_rc: int
    preempted_event_written: bool


def one(kind: str, at_step: int) -> Trial:
    d = common.scratch(f"preempt-{kind}-")
    stop, log, metrics = d / "STOP", d / "torchrun.log", d / "metrics.jsonl"
    proc = common.launch(train_entry(d, 10_000, EVERY), log, {jobenv.STOP_FILE: str(stop)})
    try:
        common.wait_for_step(metrics, at_step, proc, timeout=600)
        if kind == "signal":
            stop.touch()  # what the batch shell's trap does on USR2
            rc = proc.wait(timeout=300)
        elif kind == "sigterm":
            common.kill_tree(proc, signal.SIGTERM)  # scancel / node shutdown: every process at once
            rc = proc.wait(timeout=300)
        else:
            common.kill_tree(proc, signal.SIGKILL)
            rc = proc.wait(timeout=60)
            time.sleep(0.5)  # the workers' exit is not instantaneous
    except BaseException:
        common.kill_tree(proc, signal.SIGKILL)
        raise
    rows = common.read_jsonl(metrics)
    last = rows[-1]["step"]
    events = [e.get("event") for e in common.read_jsonl(d / "events.jsonl")]
    stop.unlink(missing_ok=True)  # the script removes STOP at every start
    common.run(
        train_entry(d, last + 2, EVERY), timeout=600, extra_env={jobenv.STOP_FILE: str(stop)}
    )
    new = common.read_jsonl(metrics)[len(rows) :]
    if not new:
        raise common.NotMeasured(f"the restarted run in {d} logged no step")
    resumed_from = new[0]["step"] - 1
    return Trial(
        stopped_at_step=at_step,
        last_logged_step=last,
        resumed_from_step=resumed_from,
        redone=last - resumed_from,
        first_run_rc=rc,
        preempted_event_written="preempted" in events,
    )


def run(quick: bool) -> list[common.Row]:
    reps = common.reps(1)  # an exact count per trial (not a noisy time): one trial each
    rng = random.Random(7)
    rows = []
    for kind, target in (("signal", "<= 0"), ("sigterm", "<= 0"), ("sigkill", f"<= {EVERY}")):
        name = f"preemption_steps_redone_{kind}"
        try:
            # a step that is not a checkpoint step, past the first checkpoint
            trials = [
                one(kind, rng.choice([s for s in range(EVERY + 1, 3 * EVERY) if s % EVERY]))
                for _ in range(reps)
            ]
        except common.NotMeasured as e:
            rows.append(common.not_measured(name, target, str(e)))
            continue
        worst = max(t["redone"] for t in trials)
        how = {
            "signal": "stop file touched (the batch shell's USR2 trap)",
            "sigterm": "SIGTERM to torchrun and every worker (scancel, node shutdown)",
            "sigkill": "SIGKILL to torchrun and every worker",
        }[kind]
        rows.append(
            common.measured(
                name,
                worst,
                target,
                checkpoint_every=EVERY,
                trials=trials,
                summary=f"{how}: worst {worst} step(s) redone over {reps} trial(s); "
                f"checkpoint every {EVERY} steps",
            )
        )
    return rows
