"""check-resume: prove on this machine that interrupting and resuming a config is bit-exact.

Two short torchrun runs (CPU, gloo) in subprocesses: uninterrupted, and interrupted at a step
through the preemption flag then resumed; their final parameter hashes are compared, and when they
differ the first differing checkpoint is named. No torch in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpctrain.kernel import jobenv, jobkey, layout
from hpctrain.kernel.checkpoint import step_name
from hpctrain.kernel.errors import UserError

SHA = "final_params.sha256"  # train_entry's hash of the final parameters


@dataclass(frozen=True)
class Verdict:
    """Interrupted and resumed vs uninterrupted (`check-resume --json`: these keys)."""

    identical: bool
    strategy: str
    steps: int
    stopped_at: int
    uninterrupted_sha256: str
    resumed_sha256: str
    first_exit_code: int  # the interrupted run's (75: stopped through the preemption flag)
    folder: str  # where the two runs are (removed when identical, unless kept)
    first_difference: dict[str, object] | None = None
    """Not identical: the first checkpoint that differs, what differs and a hint (None: no
    checkpoint of both runs differs)."""

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {k: v for k, v in vars(self).items() if k != "first_difference"}
        if not self.identical:
            out["first_difference"] = self.first_difference
        return out


@dataclass(frozen=True)
class _Runs:
    """The two short runs: where they go, and what every launch of train_entry gets."""

    base: Path
    nproc: int
    args: list[str]  # train_entry's arguments, the same for both runs

    def launch(self, run_dir: Path, extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        env = jobenv.without_run_scope(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env.update(extra_env)
        env[jobenv.JOB_KEY] = jobkey.fresh()
        cmd = [
            sys.executable,
            "-m",
            "hpctrain.launchers.rdzv",  # torchrun --standalone, its state signed: a shared node
            "--nnodes=1",
            f"--nproc-per-node={self.nproc}",
            f"--rdzv-backend={jobkey.RDZV_BACKEND}",
            "--rdzv-endpoint=127.0.0.1:0",
            f"--rdzv-id={run_dir.name}",
            "-m",
            "train_entry",
            "--run-dir",
            str(run_dir),
            *self.args,
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        with (self.base / f"{run_dir.name}.log").open("a") as f:
            f.write(f"$ {' '.join(cmd)}\n{out.stdout}{out.stderr}")
        return out

    def probe(self) -> None:
        """A bad config fails here, in one process and with train_entry's own message, not as a
        torchrun failure summary."""
        probe = subprocess.run(
            [
                sys.executable,
                "-m",
                "train_entry",
                "--run-dir",
                str(self.base / "probe"),
                *self.args,
                "--print-config",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        if probe.returncode != 0:
            msg = probe.stderr.strip()
            for prefix in ("Error: ", "error: "):
                msg = msg.removeprefix(prefix)
            raise UserError(msg or "train_entry refused the config")


def check_resume(
    *,
    strategy: str,
    steps: int,
    stop_at: int | None,
    nproc: int,
    keep_dir: Path | None,
    args: tuple[str, ...],
    say: Callable[[str], None] = lambda _: None,
) -> Verdict:
    """Train `steps` uninterrupted; train again, stopped at `stop_at` (default: half) and resumed;
    compare. The two runs are removed when identical and keep_dir is None, kept otherwise."""
    if steps < 2:
        raise UserError("--steps must be at least 2 (one step before the interruption, one after)")
    stop = stop_at if stop_at is not None else steps // 2
    if not 1 <= stop < steps:
        raise UserError(f"--stop-at {stop}: must be between 1 and {steps - 1}")
    base = keep_dir or Path(tempfile.mkdtemp(prefix="hpctrain-check-resume-"))
    base.mkdir(parents=True, exist_ok=True)
    for sub in ("full", "interrupted"):
        if (base / sub).exists():
            raise UserError(f"{base / sub} exists: give --keep an empty or new folder")
    every = ["--checkpoint.every_steps=1", f"--checkpoint.keep={steps + 1}"]
    runs = _Runs(base, nproc, ["--strategy", strategy, "--max-steps", str(steps), *every, *args])
    runs.probe()
    say(f"1/3 uninterrupted run: {steps} steps, {strategy}, {nproc} ranks")
    full = runs.launch(base / "full", {})
    if full.returncode != 0:
        raise UserError(
            f"the uninterrupted run failed (exit {full.returncode}); see {base}/full.log:\n"
            + _tail(full)
        )
    say(f"2/3 interrupted at step {stop}")
    first = runs.launch(base / "interrupted", {jobenv.STOP_AT_STEP: str(stop)})
    if (base / "interrupted" / SHA).exists():
        raise UserError(
            "the run did not stop at --stop-at (does your entry use train_entry's loop?)"
        )
    say("3/3 resumed")
    second = runs.launch(base / "interrupted", {})
    if second.returncode != 0:
        raise UserError(
            f"the resumed run failed (exit {second.returncode}); see "
            f"{base}/interrupted.log:\n" + _tail(second)
        )
    a = (base / "full" / SHA).read_text().strip()
    b = (base / "interrupted" / SHA).read_text().strip()
    verdict = Verdict(
        identical=a == b,
        strategy=strategy,
        steps=steps,
        stopped_at=stop,
        uninterrupted_sha256=a,
        resumed_sha256=b,
        first_exit_code=first.returncode,
        folder=str(base),
        first_difference=(
            None if a == b else _first_difference(base / "full", base / "interrupted", stop, steps)
        ),
    )
    if a == b and keep_dir is None:
        shutil.rmtree(base)
    return verdict


def _tail(out: subprocess.CompletedProcess[str], n: int = 15) -> str:
    return "\n".join((out.stdout + out.stderr).strip().splitlines()[-n:])


def _first_difference(full: Path, resumed: Path, stop: int, steps: int) -> dict[str, object] | None:
    """Compare the two runs' checkpoints from the stop step on, in a torch subprocess."""
    for step in range(stop, steps + 1):
        name = step_name(step)
        a, b = full / layout.CHECKPOINTS / name, resumed / layout.CHECKPOINTS / name
        if not (a.is_dir() and b.is_dir()):
            continue
        out = subprocess.run(
            [sys.executable, "-m", "train_entry.checkpoint", "compare", str(a), str(b)],
            capture_output=True,
            text=True,
        )
        if out.returncode not in (0, 1):
            return {
                "step": step,
                "differs": ["(comparison failed)"],
                "hint": out.stderr.strip()[-500:],
            }
        report = json.loads(out.stdout)
        if report["differs"]:
            return {"step": step, **report, "hint": _hint(report["differs"], step, stop)}
    return None


def _hint(differs: list[str], step: int, stop: int) -> str:
    if step == stop:
        return (
            "the checkpoint written at the interruption already differs: something before the "
            "stop depends on being interrupted (a stop check that changes training?)"
        )
    if "data" in differs:
        return "the data position is not restored: make the data pipeline resumable (state_dict)"
    if any(d.startswith("rng") for d in differs):
        return (
            "the RNG streams diverged after the resume: a generator the checkpoint does not "
            "capture (a private torch.Generator in the model or data?), or RNG use that depends "
            "on state that was not restored"
        )
    if "scheduler" in differs:
        return "the LR scheduler state is not restored"
    return (
        "the state loaded equally but training diverged after the resume: something outside the "
        "checkpoint (a private generator, a cache, an iterator position) is not restored"
    )
