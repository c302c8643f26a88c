"""render, submit, status, logs, cancel, runs: thin commands over request/render/runs/dispatch.
Nothing here imports torch (tests/test_cli_jobs.py checks sys.modules)."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from hpctrain.kernel import layout
from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.errors import UserError


def _job_options(f: Any) -> Any:
    options = [
        click.option("--profile", "-p", help="Site profile name or YAML path (default: your config's "
                     "default_profile, else `local` when sbatch is not on PATH)."),
        click.option("--nodes", "-N", type=int, help="Number of nodes (default 1)."),
        click.option("--min-nodes", type=int, help="Fewest nodes the run may train on (#SBATCH "
                     "--nodes=MIN-N): Slurm may start it on fewer, and the preflight gate continues "
                     "without a bad node (docs/bad-nodes.md). DDP/FSDP only."),
        click.option("--exclude", multiple=True, metavar="NODES",
                     help="Nodes Slurm must not give this run (#SBATCH --exclude), e.g. the list "
                          "`hpctrain doctor --bisect` prints (repeatable, or comma-separated)."),
        click.option("--gpus", "-G", type=int, help="GPUs per node (local profile: CPU workers per "
                     "simulated node). Default: all GPUs of a node, 1 locally."),
        click.option("--time", "-t", "time_min", type=int, help="Time limit in minutes "
                     "(default: the profile's slurm.default_time_min)."),
        click.option("--name", "-n", help="Run name = run folder name (default: <entry>-<date>-<time>)."),
        click.option("--strategy", "-s", type=click.Choice(strategy_names.CHOICES),
                     help="Parallelism for train_entry (default ddp; auto: from `hpctrain plan`)."),
        click.option("--script", type=click.Path(dir_okay=False), help="Run your own script under "
                     "torchrun instead of train_entry."),
        click.option("--module", help="Run your own module (PKG.MOD) under torchrun instead of train_entry."),
        click.option("--partition", help="Override slurm.partition."),
        click.option("--account", help="Override slurm.account."),
        click.option("--qos", help="Override slurm.qos."),
        click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                     help="Override any unlocked profile key, e.g. --set slurm.mem=0 (repeatable)."),
        click.option("--params", type=int, help="--strategy auto: the model's parameter count."),
        click.option("--model", "plan_model", help="--strategy auto: the model factory pkg.mod:fn."),
        click.argument("args", nargs=-1, type=click.UNPROCESSED),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _flags(partition: str | None, account: str | None, qos: str | None, sets: tuple[str, ...]) -> dict:
    flags: dict[str, object] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set {item!r}: write KEY=VALUE, e.g. --set slurm.mem=0")
        # An environment variable's value is text as typed (`--set environment.env.X=true`).
        text_key = key.startswith(("environment.env.", "network.env."))
        flags[key] = value if text_key else _scalar(value)
    for key, value in (("partition", partition), ("account", account), ("qos", qos)):
        if value is not None:
            flags[f"slurm.{key}"] = value
    return flags


def _scalar(text: str) -> object:
    """--set values are YAML scalars (numbers, booleans, null), as in a profile file."""
    from hpctrain.profiles.load import yaml_scalar

    return yaml_scalar(text)


def resolve_profile(o: dict[str, Any]) -> Any:
    from hpctrain.profiles import resolve

    return resolve(o["profile"], _flags(o["partition"], o["account"], o["qos"], o["sets"]))


class Prepared:
    """Everything submit and render agree on: the profile, the request, the run folder, the script."""

    def __init__(self, o: dict[str, Any], profile: Any = None, *, chain: bool = False) -> None:
        from hpctrain import entry_check
        from hpctrain.render import node_python, render
        from hpctrain.request import JobRequest
        from hpctrain.runs import RunDir, runs_dir_of

        self.profile = profile or resolve_profile(o)
        strategy, args = o["strategy"], tuple(o["args"])
        ours = not (o["script"] or o["module"])  # the bundled train_entry
        if ours:
            entry_check.refuse_owned(args)
            if strategy != "auto":
                strategy = entry_check.one_source(strategy, args)
        self.plan = None
        if strategy == "auto":
            self.plan = _plan(self.profile, o)
            strategy = self.plan.strategy
            if not (o["script"] or o["module"]):  # train_entry takes the plan's details as flags
                args = (*plan_args(self.plan), *args)
        explicit = strategy  # None: train_entry's own (its --config), else this one
        self.request = JobRequest.build(
            self.profile, name=o["name"], nodes=o["nodes"], gpus=o["gpus"], time_min=o["time_min"],
            strategy=strategy, script=o["script"], module=o["module"], args=args,
            min_nodes=o.get("min_nodes"), exclude=tuple(o.get("exclude") or ()))
        self.resolved = None
        if ours:  # validated at the requested world size before anything is queued
            self.resolved = entry_check.check_train_entry(
                nodes=self.request.nodes, gpus=self.request.gpus, args=args, strategy=explicit)
            if self.resolved["strategy"] != self.request.strategy:  # e.g. `strategy:` in --config
                self.request = dataclasses.replace(self.request, strategy=self.resolved["strategy"])
        self.run = RunDir(runs_dir_of(self.profile) / self.request.name)
        self.python = node_python(self.profile)
        self.script = render(self.profile, self.request, self.run.path, python=self.python, chain=chain)


def _entry_line(p: Prepared) -> str:
    if p.resolved is None:
        return f"entry {p.request.entry.kind} {p.request.entry.target}"
    from hpctrain.entry_check import describe

    return f"strategy {p.request.strategy}, {describe(p.resolved)}"


def plan_args(rec: Any) -> list[str]:
    """train_entry flags for a plan's ZeRO stage and offload (the user's own flags, after, win)."""
    if rec.strategy == "deepspeed":
        out = [f"--deepspeed.zero_stage={rec.zero_stage or 0}"]
        device = "nvme" if rec.offload == "nvme" else "cpu"
        if rec.offload != "none":
            out.append(f"--deepspeed.offload_optimizer={device}")
        if rec.offload in ("optimizer+params", "nvme") and rec.zero_stage == 3:
            out.append(f"--deepspeed.offload_param={device}")
        return out
    if rec.strategy == "fsdp" and rec.offload != "none":
        return ["--fsdp.cpu_offload=true"]
    return []


def _plan(profile: Any, o: dict[str, Any]) -> Any:
    try:
        from hpctrain.plan import recommend
    except ImportError:
        raise UserError("--strategy auto needs hpctrain.plan, which is not available in this install; "
                        "choose --strategy ddp, fsdp or deepspeed") from None
    if o["params"] is None and o["plan_model"] is None:
        raise UserError("--strategy auto needs the model size: add --params N (parameter count) or "
                        "--model pkg.mod:factory")
    source = profile.source
    return recommend(params=o["params"], model=o["plan_model"], nodes=o["nodes"] or 1,
                     gpus=o["gpus"] or (profile.slurm.gpus_per_node or 1),
                     profile=str(source) if source else profile.name)


@click.command()
@_job_options
def render(**o: Any) -> None:
    """Print the batch script that `submit` would hand to the scheduler, byte for byte.

    \b
    Example:
      hpctrain render --profile loopback --nodes 2 --gpus 2 --name demo -- --max-steps 60
    """
    prepared = Prepared(o)
    click.echo(prepared.script, nl=False)


@click.command()
@_job_options
@click.option("--wait", is_flag=True, help="Block until the job ends; exit 1 if it did not complete.")
@click.option("--dry-run", is_flag=True, help="Validate and render, say where it would go, write nothing.")
@click.option("--replace-finished", is_flag=True,
              help="If a COMPLETED run has this name, move its folder aside to NAME.old-<time> and start again.")
@click.option("--sync", type=click.Path(file_okay=False, exists=True),
              help="Remote site (profile with login:): send this folder as the run's code/ instead of "
                   "the committed tree of your --script's git repository.")
@click.option("--chain", is_flag=True,
              help="--time above the profile's slurm.max_time_min: submit ceil(time / max) jobs that run "
                   "one after another (afterany), each resuming from the newest checkpoint.")
@click.option("--code", type=click.Path(file_okay=False, exists=True), hidden=True,
              help="On the site: the uploaded code folder, moved into the run folder as code/.")
def submit(wait: bool, dry_run: bool, replace_finished: bool, **o: Any) -> None:
    """Submit a training run: train_entry (or --script/--module) on N nodes x G GPUs under torchrun.
    Arguments after `--` go to the entry.

    \b
    Examples:
      hpctrain submit --profile mycluster --nodes 2 --gpus 8 --name gpt-small -- --max-steps 1000
      hpctrain submit --nodes 2 --gpus 1 --name demo --wait -- --max-steps 60   # local, no Slurm
      hpctrain submit --nodes 1 --gpus 2 --script train.py --name mine -- --lr 3e-4
      hpctrain submit --profile mysite-remote --script train.py --name exp1   # over SSH (docs/remote.md)
      hpctrain submit --profile mycluster --time 2880 --chain --name long   # past max_time_min
    """
    from hpctrain import dispatch

    profile = resolve_profile(o)
    if profile.login is not None and not o["code"]:
        from hpctrain.remote.submit import submit as remote_submit

        sys.exit(remote_submit({**o, "wait": wait, "dry_run": dry_run, "replace_finished": replace_finished},
                               profile, echo=click.echo))
    segments: list[Any] = []
    if o["chain"]:
        from hpctrain import chain

        segments = chain.plan(o["time_min"] or profile.slurm.default_time_min, profile)
        o = {**o, "time_min": segments[0].time_min}
    p = Prepared(o, profile, chain=len(segments) > 1)
    if o["code"]:
        from hpctrain.remote.code import adopt

        adopt(p, Path(o["code"]))
    run, profile, req = p.run, p.profile, p.request
    previous = dispatch.state(run) if run.exists() else None
    run.check_free(previous, replace_finished=replace_finished)
    run.check_writable()
    where = "Slurm (sbatch)" if profile.scheduler == "slurm" else "this machine (local executor)"
    topology = f"{req.nodes} node(s) x {req.gpus} {'GPU' if profile.scheduler == 'slurm' else 'worker'}(s)"
    if dry_run:
        click.echo(f"dry run: would submit {req.name} to {where} with profile {profile.name}\n"
                   f"  topology: {topology}, time {req.time_min} min, {_entry_line(p)}\n"
                   f"  run folder: {run.path}\n  script: {len(p.script.splitlines())} lines "
                   "(`hpctrain render` with the same options prints it)")
        if len(segments) > 1:
            click.echo(f"  chain: {len(segments)} jobs (--time {sum(x.time_min for x in segments)} "
                       f"> slurm.max_time_min {profile.slurm.max_time_min}), each resuming from the newest checkpoint")
            for line in chain.describe(segments):
                click.echo(f"    {line}")
        click.echo("  nothing was written")
        return
    run.create(profile=profile, request=req, script=p.script, replace_finished=replace_finished,
               node_python=p.python)
    if run.moved_aside is not None:
        click.echo(f"{req.name} had failed before its first step: its folder (logs) is now "
                   f"{run.moved_aside}")
    if o["code"]:
        from hpctrain.remote.code import install

        install(run.path, Path(o["code"]))
    if p.plan is not None:
        run.write(layout.PLAN, p.plan.to_json() + "\n")
    if len(segments) > 1:
        ids = chain.submit(run, segments)
        job_id = " -> ".join(ids)
        click.echo(f"chain of {len(ids)} jobs, each --time <= {profile.slurm.max_time_min} min, "
                   "each waiting for the one before (afterany)")
    else:
        job_id = dispatch.submit(run, profile, time_min=req.time_min)
    click.echo(f"submitted {req.name}: job {job_id} on {where}, {topology}, {_entry_line(p)}\n"
               f"  run folder: {run.path}\n"
               f"  follow: hpctrain status {req.name}; hpctrain logs {req.name} --follow")
    if wait:
        _wait(run, req.name, total=p.resolved["max_steps"] if p.resolved else None)


def _wait(run: Any, name: str, *, total: int | None) -> None:
    """Follow the job to its end: state and training progress; on failure, why and where."""
    from hpctrain import dispatch
    from hpctrain.progress import Follower, describe, root_cause, snapshot

    follow = Follower(run.path, total=total, out=lambda s: click.echo(s, err=True))
    try:
        final = dispatch.wait(run, on_poll=follow)
    except KeyboardInterrupt:
        follow.close()
        click.echo(f"\nstopped waiting; {name} keeps running (`hpctrain cancel {name}` stops it)",
                   err=True)
        sys.exit(130)
    follow.close()
    click.echo(f"{name}: {final}  {describe(snapshot(run.path, total))}")
    if final != "COMPLETED":
        cause = root_cause(run.path)
        if cause:
            click.echo(f"  why: {cause['line']}\n  full log: {cause['log']}", err=True)
        else:
            click.echo(f"  no error line found; logs: {run.logs} (`hpctrain logs {name}`)", err=True)
        sys.exit(1)


_runs_dir_option = click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path),
                                help="Where to look for runs by name (default ./runs, then the run index).")


def _summary(run: Any) -> dict[str, Any]:
    """One run's row; a run whose files cannot be read is a BROKEN row saying why (one broken
    folder never hides the others)."""
    from hpctrain.runs import BrokenRun

    try:
        return _read_summary(run)
    except (BrokenRun, OSError, ValueError, TypeError, AttributeError, KeyError) as e:
        why = e.format_message() if isinstance(e, BrokenRun) else f"{type(e).__name__}: {e}"
        return {"name": run.name, "state": "BROKEN", "job_id": None, "scheduler": None, "profile": None,
                "nodes": None, "gpus_per_node": None, "strategy": None, "restarts": 0, "starts": 0,
                "checkpoint_step": None, "created": None, "path": str(run.path), "reason": why}


def _read_summary(run: Any) -> dict[str, Any]:
    from hpctrain import dispatch

    frozen = run.frozen()
    req = frozen.get("request", {})
    restarts = run.restarts()
    state = dispatch.state(run)
    return {
        "name": run.name,
        "state": state,
        "job_id": run.last_job_id(),
        "scheduler": frozen.get("profile", {}).get("scheduler"),
        "profile": frozen.get("profile", {}).get("name"),
        "nodes": req.get("nodes"),
        "gpus_per_node": req.get("gpus"),
        # a user's own script or module has no strategy of ours: show its entry instead
        "strategy": req.get("strategy") if req.get("entry", {}).get("kind", "train_entry") ==
        "train_entry" else req.get("entry", {}).get("kind"),
        "restarts": max(0, len(restarts) - len(run.jobs())) if restarts else 0,
        "starts": len(restarts),
        "checkpoint_step": run.newest_checkpoint_step(),
        "created": frozen.get("created"),
        "path": str(run.path),
        "reason": None,
    } | _reason(run, state)


def _reason(run: Any, state: str) -> dict[str, Any]:
    if state in ("FAILED", "LOST", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY"):
        return {"reason": run.failure_reason()}
    return {}


@click.command()
@click.argument("run", required=False)
@_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def status(run: str | None, runs_dir: Path | None, as_json: bool) -> None:
    """Show a run's state, job id, nodes, restarts and newest checkpoint step (or every run's).

    \b
    Example:
      hpctrain status demo
      hpctrain status demo --json
    """
    from hpctrain.remote.forward import maybe_forward

    maybe_forward("status", run, runs_dir)
    from hpctrain import sweep as sweeps

    found = sweeps.find(run, runs_dir) if run else None
    if found is not None:
        from hpctrain.cli.sweep import show

        show(found, as_json)
        return
    from hpctrain.runs import all_runs, find_run

    if run is None:
        items = [_summary(r) for r in all_runs(runs_dir)]
        if as_json:
            click.echo(json.dumps(items, indent=2))
        else:
            _table(items)
        return
    from hpctrain.progress import describe, root_cause, snapshot

    r = find_run(run, runs_dir)
    info = _summary(r)
    if info["state"] == "BROKEN":
        raise UserError(info["reason"])
    info["history"] = r.restarts()
    info["jobs"] = r.jobs()
    from hpctrain import chain

    segments = chain.states(r)
    if segments:
        info["chain"] = segments
    info["progress"] = snapshot(r.path)
    failed = info["state"] not in ("COMPLETED", "RUNNING", "PENDING", "UNKNOWN", "REQUEUED")
    info["root_cause"] = root_cause(r.path) if failed else None
    from hpctrain.preflight.gate import health, health_lines

    info.update(health(r.events()))
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    step = info["checkpoint_step"]
    click.echo(f"{info['name']}: {info['state']}  (job {info['job_id']}, {info['scheduler']}, "
               f"profile {info['profile']})\n"
               f"  topology: {info['nodes']} node(s) x {info['gpus_per_node']}, strategy {info['strategy']}\n"
               f"  restarts: {info['restarts']} ({info['starts']} start(s) of the script)\n"
               f"  training: {describe(info['progress'])}\n"
               f"  newest checkpoint: {'step ' + str(step) if step is not None else 'none yet'}\n"
               f"  folder: {info['path']}")
    if segments:
        click.echo(f"  chain: {len(segments)} jobs, one after another: "
                   + " -> ".join(f"{x['job_id']} {x['state']}" for x in segments))
    if info.get("reason"):
        click.echo(f"  reason: {info['reason']}")
    if info["root_cause"]:
        click.echo(f"  why it failed: {info['root_cause']['line']}\n"
                   f"  full log: {info['root_cause']['log']}")
    for line in health_lines(info):
        click.echo(line)
    for start in info["history"]:
        click.echo(f"    start {start.get('time')} job {start.get('job_id')} restart "
                   f"{start.get('restart_count')} on {start.get('host')}")


@click.command()
@_runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def runs(runs_dir: Path | None, as_json: bool) -> None:
    """List runs (./runs and every run created from this account) in a table.

    \b
    Example:
      hpctrain runs
      hpctrain runs --json
    """
    from hpctrain.remote.index import sites
    from hpctrain.runs import all_runs

    items = [_summary(r) for r in all_runs(runs_dir)]
    remote = sites()
    if as_json:
        if remote:
            from hpctrain.remote.forward import each_json

            items += each_json(["runs", "--json"])
        click.echo(json.dumps(items, indent=2))
        return
    _table(items)
    from hpctrain import sweep as sweeps

    for found in sweeps.all_sweeps(runs_dir):
        from hpctrain.cli.sweep import show

        click.echo("")
        show(found, False)
    if remote:
        from hpctrain.remote.forward import each_site

        each_site(["runs"])


def _table(items: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "state", "job", "nodes x gpus", "strategy", "restarts", "ckpt step", "created")
    for i in items:
        table.add_row(i["name"], i["state"], str(i["job_id"]), f"{i['nodes']} x {i['gpus_per_node']}",
                      str(i["strategy"]), str(i["restarts"]),
                      "-" if i["checkpoint_step"] is None else str(i["checkpoint_step"]), str(i["created"]))
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # piped: no truncation
    console.print(table)
    for i in items:
        if i["state"] == "BROKEN":
            click.echo(f"{i['name']}: broken: {i['reason']}")


@click.command()
@click.argument("run")
@click.option("--rank", "-r", type=int, help="One rank's output: logs/rank-R.log (train_entry), or torchrun's "
              "per-rank files under logs/torchrun/ (your own --script/--module).")
@click.option("--node", type=int, help="Show logs/node-N.log (one per node: torchrun and the workers).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the job ends (Ctrl-C stops).")
@_runs_dir_option
def logs(run: str, rank: int | None, node: int | None, follow: bool, runs_dir: Path | None) -> None:
    """Show a run's logs: the batch script's log, or one node's or one rank's.

    \b
    Examples:
      hpctrain logs demo            # logs/batch.log, then every node log
      hpctrain logs demo --rank 1
      hpctrain logs demo --node 0 --follow
    """
    from hpctrain.remote.forward import maybe_forward

    maybe_forward("logs", run, runs_dir)
    from hpctrain import sweep as sweeps

    if sweeps.find(run, runs_dir) is not None:
        raise UserError(f"{run} is a sweep: give one point, e.g. `hpctrain logs {run}/0` "
                        f"(`hpctrain status {run}` lists them)")
    from hpctrain.runs import find_run

    r = find_run(run, runs_dir)
    if rank is not None and node is not None:
        raise UserError("give --rank or --node, not both")
    if rank is not None:
        files = [r.logs / f"rank-{rank}.log"]
        if not files[0].is_file():
            files = _torchrun_rank_logs(r, rank) or files
    elif node is not None:
        files = [r.logs / f"node-{node}.log"]
    else:
        files = [r.logs / "batch.log", *sorted(r.logs.glob("node-*.log"))]
    missing = [f for f in files if not f.is_file()]
    if rank is not None or node is not None:
        if missing and not follow:
            have = ", ".join(sorted(p.name for p in r.logs.glob("*.log"))) or "none yet"
            raise UserError(f"{missing[0]} does not exist (logs of {r.name}: {have})")
    if not follow:
        for f in files:
            if f.is_file():
                if len(files) > 1:
                    click.echo(f"==> {f} <==")
                click.echo(f.read_text(errors="replace"), nl=False)
        return
    _follow(r, files, new_nodes=rank is None and node is None)


def _torchrun_rank_logs(run: Any, rank: int) -> list[Path]:
    """A user script's rank output: torchrun's --tee files, logs/torchrun/node-N/<id>/attempt_K/<local>/."""
    gpus = int(run.frozen().get("request", {}).get("gpus") or 1)
    node, local = divmod(rank, gpus)
    found = (run.logs / "torchrun" / f"node-{node}").glob(f"*/attempt_*/{local}/std*.log")
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))


def _follow(run: Any, files: list[Path], *, new_nodes: bool = False) -> None:
    """Print what is added to `files` until the job ends; `new_nodes`: node logs that appear later
    (the job was pending when following began) are followed too."""
    from hpctrain import dispatch
    from hpctrain.runs import TERMINAL

    offsets = {f: 0 for f in files}
    finished_polls = 0
    try:
        while True:
            if new_nodes:
                for f in sorted(run.logs.glob("node-*.log")):
                    offsets.setdefault(f, 0)
            for f in list(offsets):
                if f.is_file():
                    with f.open("rb") as fh:
                        fh.seek(offsets[f])
                        chunk = fh.read()
                    if chunk:
                        offsets[f] += len(chunk)
                        click.echo(chunk.decode(errors="replace"), nl=False)
            if dispatch.state(run) in TERMINAL:
                finished_polls += 1
                if finished_polls > 1:  # one last read after the end
                    return
            time.sleep(1)
    except KeyboardInterrupt:
        return


@click.command()
@click.argument("run")
@_runs_dir_option
def cancel(run: str, runs_dir: Path | None) -> None:
    """Cancel a run's current job (Slurm: scancel; local: TERM, then KILL after 60 s).
    The run folder and its checkpoints stay; `hpctrain resume RUN` continues it.

    \b
    Example:
      hpctrain cancel demo
    """
    from hpctrain.remote.forward import maybe_forward

    maybe_forward("cancel", run, runs_dir)
    from hpctrain import sweep as sweeps

    found = sweeps.find(run, runs_dir)
    if found is not None:
        done = sweeps.cancel(found)
        for point, state in done:
            click.echo(f"{found.name}/{point}: cancel sent (now {state})")
        click.echo(f"sweep {found.name}: {len(done)} point(s) cancelled; resume with "
                   f"`hpctrain resume {found.name}`")
        return
    from hpctrain import dispatch
    from hpctrain.runs import TERMINAL, find_run

    r = find_run(run, runs_dir)
    before = dispatch.state(r)
    if before in TERMINAL:
        click.echo(f"{r.name} is not running ({before}); nothing to cancel")
        return
    after = dispatch.cancel(r)
    click.echo(f"{r.name}: cancel sent (was {before}, now {after}); resume with `hpctrain resume {r.name}`")
