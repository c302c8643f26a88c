"""resume, preempt, check-resume. No torch here: training and checkpoint reading run in subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from hpctrain.kernel import jobenv, layout
from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.checkpoint import newest_verified
from hpctrain.kernel.errors import UserError

ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}

_runs_dir_option = click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path),
                                help="Where to look for runs by name (default ./runs, then the run index).")


def _newest_checkpoint(run: Any) -> tuple[str, dict] | None:
    """(folder name, manifest) of the newest checkpoint that verifies, read without torch."""
    found = newest_verified(run.path / layout.CHECKPOINTS,
                            warn=lambda msg: click.echo(f"warning: {msg}", err=True))
    return (found[0].name, found[1]) if found else None


def _max_steps(args: tuple[str, ...] | list[str]) -> int | None:
    """The last --max-steps / --train.max_steps in the entry's arguments, if any."""
    value = None
    args = list(args)
    for i, a in enumerate(args):
        for flag in ("--max-steps", "--train.max_steps"):
            if a == flag and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(flag + "="):
                value = a.split("=", 1)[1]
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("run")
@click.option("--wait", is_flag=True, help="Block until the job ends; exit 1 if it did not complete.")
@click.option("--time", "-t", "time_min", type=int, help="New time limit in minutes.")
@click.option("--max-steps", type=int, help="Train to this many steps (more than before).")
@click.option("--nodes", "-N", type=int,
              help="Another node count (DDP/FSDP only: their checkpoints reshard; DeepSpeed's do not).")
@click.option("--json", "as_json", is_flag=True, help="Print the resubmission as JSON.")
@_runs_dir_option
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def resume(run: str, wait: bool, time_min: int | None, max_steps: int | None, nodes: int | None,
           as_json: bool, runs_dir: Path | None, args: tuple[str, ...]) -> None:
    """Resubmit a cancelled, failed, timed-out or preempted run into its own folder: same frozen
    profile and script, training continues from the newest verified checkpoint. Arguments after
    `--` are appended to the entry's arguments.

    \b
    Examples:
      hpctrain resume demo
      hpctrain resume demo --time 240 --wait
      hpctrain resume demo --max-steps 2000 --nodes 2     # DDP/FSDP: fewer nodes reshard
      hpctrain resume demo -- --optim.lr=1e-4
    """
    from hpctrain.remote.forward import maybe_forward

    maybe_forward("resume", run, runs_dir)
    from hpctrain import sweep as sweeps

    found = sweeps.find(run, runs_dir)
    if found is not None and sweeps.read(found).get("scheduler") == "local":
        n = sweeps.resume_local(found)
        click.echo(f"sweep {found.name}: {n} point(s) to run again, "
                   f"{sweeps.read(found).get('max_parallel') or 1} at a time (local runner)")
        return
    if found is not None:  # every point that stopped before finishing
        rows = [r for r in sweeps.table(found) if r["state"] in sweeps.RESUMABLE]
        for row in rows:
            click.echo(f"{found.name}/{row['point']} ({row['state']}):")
            click.get_current_context().invoke(
                resume, run=row["path"], wait=False, time_min=time_min, max_steps=max_steps,
                nodes=nodes, as_json=False, runs_dir=None, args=args)
        click.echo(f"sweep {found.name}: {len(rows)} point(s) resumed")
        return
    from hpctrain import dispatch
    from hpctrain.profiles import Profile
    from hpctrain.render import render
    from hpctrain.request import JobRequest
    from hpctrain.runs import find_run

    r = find_run(run, runs_dir)
    frozen = r.frozen()
    current = dispatch.state(r)
    if current in ACTIVE:
        raise UserError(f"{r.name} is {current} (job {r.last_job_id()}): it is still running and resumes "
                        f"by itself after a preemption; to restart it, `hpctrain cancel {r.name}` first")
    req = JobRequest.from_dict(frozen["request"])
    old_steps = _max_steps(req.args)
    ckpt = _newest_checkpoint(r)
    done_step = ckpt[1]["step"] if ckpt else None
    if current == "COMPLETED" and (max_steps is None or (old_steps is not None and max_steps <= old_steps)):
        raise UserError(f"{r.name} is COMPLETED ({'step ' + str(done_step) if ckpt else 'no checkpoint'}); "
                        f"nothing to resume. To train further pass --max-steps N with N > "
                        f"{old_steps if old_steps is not None else 'the steps done'}; to start over use "
                        "`hpctrain submit --replace-finished`")
    if max_steps is not None:
        floor = max(x for x in (old_steps, done_step, 0) if x is not None)
        if max_steps < floor:
            raise UserError(f"--max-steps {max_steps} is fewer than the {floor} steps the run was set to "
                            "(or has done); resume can only add steps")
    profile = Profile.model_validate(frozen["profile"])
    changes: dict[str, Any] = {}
    new_args = list(req.args)
    if max_steps is not None:
        new_args += ["--max-steps", str(max_steps)]
        changes["max_steps"] = max_steps
    if args:
        new_args += list(args)
        changes["args"] = list(args)
    if time_min is not None and time_min != req.time_min:
        changes["time_min"] = time_min
    if nodes is not None and nodes != req.nodes:
        strategy = ckpt[1]["strategy"] if ckpt else req.strategy
        if not strategy_names.info(strategy).reshards:
            raise UserError(
                f"--nodes {nodes}: {r.name} uses {strategy}, whose checkpoints load only at the world "
                f"size they were saved with ({req.nodes} node(s) x {req.gpus}); resume with --nodes "
                f"{req.nodes}, or see docs/checkpoint-resume.md (DeepSpeed universal checkpoints)")
        if req.entry.kind != "train_entry":
            click.echo(f"warning: --nodes {nodes}: your own entry must reshard its checkpoint itself",
                       err=True)
        elif ckpt and not any(a.startswith(("--train.", "--config")) for a in args):
            _check_batch(r.path / "checkpoints" / ckpt[0] / "config.json", nodes * req.gpus, nodes)
        changes["nodes"] = nodes
    new = JobRequest(name=req.name, nodes=changes.get("nodes", req.nodes), gpus=req.gpus,
                     time_min=changes.get("time_min", req.time_min), strategy=req.strategy,
                     entry=req.entry, args=tuple(new_args))
    problems = new.problems(profile)
    if problems:
        from hpctrain.kernel.errors import ValidationError

        raise ValidationError(problems)
    if changes:   # the script changes with the request; both are re-frozen, the old script kept
        stamp = time.strftime("%Y%m%d-%H%M%S")
        from hpctrain.runs import copy_aside

        copy_aside(r.job_sh, f"job.sh.before-resume-{stamp}")   # never over an earlier one
        r.write_script(render(profile, new, r.path))
        frozen["request"] = new.to_dict()
        frozen.setdefault("resumes", []).append({"time": stamp, "changes": changes})
        r.freeze(frozen)
    job_id = dispatch.submit(r, profile, time_min=new.time_min, kind="resume")
    record = r.event("resume", job_id=job_id, previous_state=current,
                     from_checkpoint=ckpt[0] if ckpt else None, changes=changes)
    if as_json:
        click.echo(json.dumps(record | {"name": r.name, "path": str(r.path)}, indent=2))
    else:
        origin = f"from {ckpt[0]} (verified)" if ckpt else "from the start (no verified checkpoint yet)"
        click.echo(f"resumed {r.name} (was {current}): job {job_id}, {origin}"
                   + (f"\n  changed: {json.dumps(changes)}" if changes else "")
                   + f"\n  follow: hpctrain status {r.name}; hpctrain logs {r.name} --follow")
    if wait:
        final = dispatch.wait(r, on_change=lambda s: click.echo(f"  {time.strftime('%H:%M:%S')} {s}",
                                                                err=True))
        click.echo(f"{r.name}: {final}")
        if final != "COMPLETED":
            sys.exit(1)


def _check_batch(config_json: Path, world: int, nodes: int) -> None:
    """The frozen TrainConfig's batch arithmetic at the new world size (train_entry would refuse it
    at start, after the job waited in the queue)."""
    try:
        t = json.loads(config_json.read_text())["train"]
        global_batch, micro, accum = int(t["global_batch"]), int(t["micro_batch"]), t.get("grad_accum")
    except (OSError, ValueError, KeyError, TypeError):
        return
    per_step = world * micro
    if accum is None and global_batch % per_step == 0:
        return
    if accum is not None and per_step * int(accum) == global_batch:
        return
    raise UserError(f"--nodes {nodes}: train.global_batch({global_batch}) does not split over "
                    f"{world} ranks x train.micro_batch({micro})"
                    + (f" x train.grad_accum({accum})" if accum is not None else "")
                    + "; choose a node count that divides it, or pass e.g. "
                    "-- --train.micro_batch=N (the global batch stays the same)")


@click.command()
@click.argument("run")
@click.option("--signal", "sig", help="Signal to send: USR2, USR1, HUP, INT, URG or TERM "
              "(default: the profile's preemption.signal).")
@_runs_dir_option
def preempt(run: str, sig: str | None, runs_dir: Path | None) -> None:
    """Send a run the preemption signal the way the scheduler would, to rehearse a preemption:
    the job saves a checkpoint at the next step boundary, exits 75 and requeues itself.

    \b
    Slurm: scancel --batch --signal=USR2 <job id>; local: kill -USR2 <script pid>.
    Example:
      hpctrain preempt demo
    """
    from hpctrain.remote.forward import maybe_forward

    maybe_forward("preempt", run, runs_dir)
    from hpctrain import sweep as sweeps

    if sweeps.find(run, runs_dir) is not None:
        raise UserError(f"{run} is a sweep: preempt one point, e.g. `hpctrain preempt {run}/0`")
    from hpctrain import dispatch
    from hpctrain.runs import find_run

    r = find_run(run, runs_dir)
    frozen = r.frozen()
    name = (sig or frozen.get("profile", {}).get("preemption", {}).get("signal") or "USR2").upper()
    name = name.removeprefix("SIG")
    from hpctrain.procs import PREEMPT_SIGNALS

    if name not in PREEMPT_SIGNALS:
        raise UserError(f"--signal {sig}: not a signal preempt sends; use one of "
                        f"{', '.join(PREEMPT_SIGNALS)} (USR2, the default, is what Slurm sends)")
    current = dispatch.state(r)
    if current != "RUNNING":
        raise UserError(f"{r.name} is {current}, not RUNNING: only a running job can be preempted")
    if r.scheduler() == "slurm":
        job_id = r.last_job_id()
        proc = subprocess.run(["scancel", "--batch", f"--signal={name}", str(job_id)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise UserError(f"scancel --batch --signal={name} {job_id} failed: {proc.stderr.strip()}")
        target = f"job {job_id} (scancel --batch --signal={name})"
    else:
        from hpctrain.dispatch.local import script_pid

        pid = script_pid(r)
        if not pid:
            raise UserError(f"{r.name}: no running batch script of this run (state.json names none, or "
                            "its pid now belongs to another process); nothing was signalled")
        try:
            os.kill(int(pid), getattr(signal, f"SIG{name}"))
        except ProcessLookupError:
            raise UserError(f"{r.name}: the script (pid {pid}) is gone") from None
        target = f"the batch script (pid {pid}, kill -{name})"
    click.echo(f"sent SIG{name} to {target}; {r.name} saves at the next step boundary, exits 75 and "
               f"requeues. Follow: hpctrain status {r.name}")


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--strategy", "-s", type=click.Choice(strategy_names.NAMES), default=strategy_names.DEFAULT,
              show_default=True, help="Strategy to check.")
@click.option("--steps", type=int, default=6, show_default=True, help="Steps of each short run.")
@click.option("--stop-at", type=int, help="Interrupt at this step (default: half of --steps).")
@click.option("--nproc", type=int, default=2, show_default=True, help="Local ranks (torchrun).")
@click.option("--keep", "keep_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the two runs in this folder (default: a temporary one, removed on success).")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def check_resume(strategy: str, steps: int, stop_at: int | None, nproc: int, keep_dir: Path | None,
                 as_json: bool, args: tuple[str, ...]) -> None:
    """Prove that interrupting and resuming your config is bit-exact, on this machine (CPU, gloo).

    Trains --steps uninterrupted; trains again, stops at --stop-at through the preemption flag
    (checkpoint, exit 75) and resumes; compares final_params.sha256. When they differ, it compares
    the two runs' checkpoints step by step and names the first step and the state that differed
    (model, optimizer, RNG, data position, scheduler). Arguments after `--` go to train_entry.

    \b
    Examples:
      hpctrain check-resume
      hpctrain check-resume --strategy fsdp --steps 8 -- --model mypkg.model:build --data mypkg.data:build
    """
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
    common = ["--strategy", strategy, "--max-steps", str(steps), "--checkpoint.every_steps=1",
              f"--checkpoint.keep={steps + 1}", *args]

    def launch(run_dir: Path, extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        env = jobenv.without_run_scope(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")
        env.update(extra_env)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "train_entry", "--run-dir", str(run_dir), *common]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        with (base / f"{run_dir.name}.log").open("a") as f:
            f.write(f"$ {' '.join(cmd)}\n{out.stdout}{out.stderr}")
        return out

    def say(msg: str) -> None:
        if not as_json:
            click.echo(msg, err=True)

    # A bad config fails here, in one process and with train_entry's own message, not as a torchrun
    # failure summary.
    probe = subprocess.run([sys.executable, "-m", "train_entry", "--run-dir", str(base / "probe"),
                            *common, "--print-config"], capture_output=True, text=True,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    if probe.returncode != 0:
        msg = probe.stderr.strip()
        for prefix in ("Error: ", "error: "):
            msg = msg.removeprefix(prefix)
        raise UserError(msg or "train_entry refused the config")
    say(f"1/3 uninterrupted run: {steps} steps, {strategy}, {nproc} ranks")
    full = launch(base / "full", {})
    if full.returncode != 0:
        raise UserError(f"the uninterrupted run failed (exit {full.returncode}); see {base}/full.log:\n"
                        + _tail(full))
    say(f"2/3 interrupted at step {stop}")
    first = launch(base / "interrupted", {jobenv.STOP_AT_STEP: str(stop)})
    if (base / "interrupted" / "final_params.sha256").exists():
        raise UserError("the run did not stop at --stop-at (does your entry use train_entry's loop?)")
    say("3/3 resumed")
    second = launch(base / "interrupted", {})
    if second.returncode != 0:
        raise UserError(f"the resumed run failed (exit {second.returncode}); see "
                        f"{base}/interrupted.log:\n" + _tail(second))
    a = (base / "full" / "final_params.sha256").read_text().strip()
    b = (base / "interrupted" / "final_params.sha256").read_text().strip()
    verdict: dict[str, Any] = {"identical": a == b, "strategy": strategy, "steps": steps,
                               "stopped_at": stop, "uninterrupted_sha256": a, "resumed_sha256": b,
                               "first_exit_code": first.returncode, "folder": str(base)}
    if a != b:
        verdict["first_difference"] = _first_difference(base / "full", base / "interrupted", stop, steps)
    if as_json:
        click.echo(json.dumps(verdict, indent=2))
    elif a == b:
        click.echo(f"bit-identical: interrupted at step {stop} and resumed, {strategy} x {nproc} ranks "
                   f"ends with the same parameters as the uninterrupted run (sha256 {a[:16]}...)")
    else:
        diff = verdict["first_difference"]
        click.echo(f"NOT identical: uninterrupted {a[:16]}... vs resumed {b[:16]}...")
        if diff:
            click.echo(f"  first differing checkpoint: step {diff['step']}: {', '.join(diff['differs'])}")
            click.echo(f"  hint: {diff['hint']}")
        click.echo(f"  runs kept in {base}")
    if a == b and keep_dir is None:
        shutil.rmtree(base)
    if a != b:
        sys.exit(1)


def _tail(out: subprocess.CompletedProcess[str], n: int = 15) -> str:
    return "\n".join((out.stdout + out.stderr).strip().splitlines()[-n:])


def _first_difference(full: Path, resumed: Path, stop: int, steps: int) -> dict | None:
    """Compare the two runs' checkpoints from the stop step on, in a torch subprocess."""
    for step in range(stop, steps + 1):
        name = f"step-{step:08d}"
        a, b = full / "checkpoints" / name, resumed / "checkpoints" / name
        if not (a.is_dir() and b.is_dir()):
            continue
        out = subprocess.run([sys.executable, "-m", "train_entry.checkpoint", "compare", str(a), str(b)],
                             capture_output=True, text=True)
        if out.returncode not in (0, 1):
            return {"step": step, "differs": ["(comparison failed)"], "hint": out.stderr.strip()[-500:]}
        report = json.loads(out.stdout)
        if report["differs"]:
            return {"step": step, **report, "hint": _hint(report["differs"], step, stop)}
    return None


def _hint(differs: list[str], step: int, stop: int) -> str:
    if step == stop:
        return ("the checkpoint written at the interruption already differs: something before the "
                "stop depends on being interrupted (a stop check that changes training?)")
    if "data" in differs:
        return "the data position is not restored: make the data pipeline resumable (state_dict)"
    if any(d.startswith("rng") for d in differs):
        return ("the RNG streams diverged after the resume: a generator the checkpoint does not "
                "capture (a private torch.Generator in the model or data?), or RNG use that depends "
                "on state that was not restored")
    if "scheduler" in differs:
        return "the LR scheduler state is not restored"
    return ("the state loaded equally but training diverged after the resume: something outside the "
            "checkpoint (a private generator, a cache, an iterator position) is not restored")
