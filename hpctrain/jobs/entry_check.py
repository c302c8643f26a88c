"""Submit-time checks of the entry's settings: one source each, validated before anything is queued.

- One source: a setting that both `submit` and the entry take (`--strategy`) is read from where the
  user gave it; given twice with different values it is refused, naming both. `--run-dir` belongs to
  hpctrain (the run folder) and is refused after `--`.
- For train_entry, the frozen config is validated at the requested world size (nodes x GPUs) with
  train_entry's own code: the batch arithmetic (defaults adapt: train_entry.config.check_sizes),
  the model/data factories importable and DeepSpeed present and accepting the config. A bad one is
  exit 2 with train_entry's message and fix, and nothing is queued or written.

The config check runs in this process (no torch); factories and DeepSpeed need torch and the user's
code, so they are checked by `python -m train_entry --check` in a child process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, TypedDict, cast

from hpctrain.kernel import jobenv
from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.errors import UserError
from hpctrain.profiles import cache

# Names of the job environment train_entry reads for the topology (docs/design.md contract).
ENV_NNODES, ENV_GPUS = jobenv.NNODES, jobenv.GPUS_PER_NODE
OWNED = {"--run-dir": "hpctrain sets it to the run folder; remove it from the arguments after `--`"}
SHARED = ("strategy",)  # entry flags that `submit` also takes


class Resolved(TypedDict):
    """What train_entry's config resolves to at the requested world size."""

    strategy: str
    global_batch: int
    micro_batch: int
    grad_accum: int
    max_steps: int
    world_size: int
    dp: int  # data-parallel ranks: tp and pp peers share a batch
    tp: int
    pp: int
    # for the snapshot memory plan (hpctrain/plan/snapshots.py)
    params: int | None  # the demo GPT's; None for a factory's model
    optimizer: str
    snapshot_every: int | None
    snapshot_budget: float


def entry_flag(args: tuple[str, ...] | list[str], name: str) -> str | None:
    """The value of `--name V` / `--name=V` in the entry's arguments (the last one, as argparse)."""
    flag, value = f"--{name}", None
    items = list(args)
    for i, item in enumerate(items):
        if item == flag and i + 1 < len(items):
            value = items[i + 1]
        elif item.startswith(flag + "="):
            value = item.split("=", 1)[1]
    return value


def without_flag(args: tuple[str, ...], name: str) -> tuple[str, ...]:
    """The entry's arguments less every `--name V` / `--name=V`: hpctrain passes that one itself."""
    flag, out, skip = f"--{name}", [], False
    for item in args:
        if skip:
            skip = False
        elif item == flag:
            skip = True
        elif not item.startswith(flag + "="):
            out.append(item)
    return tuple(out)


def one_source(
    submit_value: str | None, args: tuple[str, ...], name: str = "strategy"
) -> str | None:
    """The setting from wherever it was given; refused when given twice with different values."""
    entry = entry_flag(args, name)
    if submit_value and entry and submit_value != entry:
        raise UserError(
            f"--{name} is given twice and they disagree: `submit --{name} {submit_value}` "
            f"and the entry's `--{name} {entry}` after `--`; give it once (either place)"
        )
    return submit_value or entry


def refuse_owned(args: tuple[str, ...] | list[str]) -> None:
    """`--run-dir` after `--` is hpctrain's; so is any prefix of it, and a prefix of a shared flag
    (`--strat`) would slip past one_source: the entry's argparse expands an unambiguous prefix."""
    for a in args:
        flag = a.split("=", 1)[0]
        if not flag.startswith("--") or len(flag) < 3:
            continue
        for owned, why in OWNED.items():
            if flag == owned:
                raise UserError(f"{owned} after `--`: {why}")
            if owned.startswith(flag):
                raise UserError(f"{a} after `--`: the entry reads {flag} as {owned}; {why}")
        for name in SHARED:
            full = f"--{name}"
            if flag != full and full.startswith(flag):
                raise UserError(
                    f"{a} after `--`: the entry reads {flag} as {full}; fix: write {full} in "
                    f"full (or give `submit --{name}`)"
                )


def check_train_entry(
    *,
    nodes: int,
    gpus: int,
    args: tuple[str, ...],
    strategy: str | None,
    python: str | None = None,
    domain: int | None = None,
) -> Resolved:
    """Validate train_entry's config at world = nodes x gpus; return what it resolved to.
    The parallel layout is checked against the topology: tp inside a node (and inside the
    profile's fast-link `domain`, slurm.gpus_per_domain, when smaller), pp stages dividing the
    layers, tp x pp dividing the world.

    A config that validated before with the same arguments, config file, topology and train_entry
    sources is answered from the profile cache (hpctrain/profiles/cache.py): the check imports
    pydantic and train_entry's config, which would double `submit`'s start-up. A config that needs
    the probe (factories, DeepSpeed) is probed every time."""
    key: dict[str, Any] | None = {
        "nodes": nodes,
        "gpus": gpus,
        "args": list(args),
        "strategy": strategy,
        "domain": domain,
        "env": [os.environ.get(ENV_NNODES), os.environ.get(ENV_GPUS)],
        "config": None,
    }
    config = entry_flag(args, "config")
    if config is not None:
        try:
            key["config"] = Path(config).read_text()  # type: ignore[index]
        except (OSError, UnicodeDecodeError):
            key = None
    pkg = Path(__file__).resolve().parent.parent  # hpctrain/ (this file is hpctrain/jobs/)
    root = pkg.parent / "train_entry"
    # what the check runs: this module, train_entry's config (a module or a package), its CLI and
    # the safe YAML reader the config is read with
    sources = (
        Path(__file__).resolve(),
        *sorted(root.glob("config.py")),
        *sorted((root / "config").rglob("*.py")),
        root / "cli.py",
        *(pkg / "kernel" / f for f in ("yamlsafe.py", "mesh.py")),
        pkg / "kernel" / "strategies.py",
    )
    hit = cache.recall("entry_check", key, sources) if key is not None else None
    if isinstance(hit, dict) and "resolved" in hit and hit["probe"] is not None:
        if hit["probe"]:
            _probe(
                python or sys.executable,
                [*(["--strategy", strategy] if strategy else []), *args],
                nodes=nodes,
                gpus=gpus,
                where=f"at {nodes} node(s) x {gpus} = world size {nodes * gpus}",
            )
        return cast("Resolved", dict(hit["resolved"]))
    resolved, probed = _check_train_entry(
        nodes=nodes, gpus=gpus, args=args, strategy=strategy, python=python, domain=domain
    )
    if key is not None and probed is not None:
        cache.remember("entry_check", key, {"resolved": resolved, "probe": probed}, sources)
    return resolved


def _check_train_entry(
    *,
    nodes: int,
    gpus: int,
    args: tuple[str, ...],
    strategy: str | None,
    python: str | None,
    domain: int | None = None,
) -> tuple[Resolved, bool | None]:
    """The check itself; with whether it needed the probe (None: not to be cached, it also
    asked whether the tracker's package is installed)."""
    from train_entry import cli, config  # lazy: CLI start-up: a cache miss only (pydantic)

    world = nodes * gpus
    given = [*(["--strategy", strategy] if strategy else []), *args]
    ns, rest = cli.parser().parse_known_args(given)
    flags = {key: getattr(ns, name) for name, key in cli.NAMED.items()}
    where = f"at {nodes} node(s) x {gpus} = world size {world}"
    try:
        cfg = config.load_config(ns.config, rest, flags, world=world, gpus_per_node=gpus)
        accum = config.check_sizes(cfg, world, gpus)
        _check_domain(cfg.parallel.tp, gpus, domain)
    except UserError as e:
        raise UserError(
            f"train_entry's config does not work {where}:\n  {_one(e)}\n"
            "nothing was queued (`python -m train_entry --help` lists every key)"
        ) from None
    if cfg.train.tracker != "none":
        from train_entry.trackers import check_installed  # lazy: CLI start-up: a tracker only

        try:
            check_installed(cfg.train.tracker)
        except UserError as e:
            raise UserError(f"train_entry's config does not work {where}:\n  {_one(e)}") from None
    probe: bool | None = bool(
        cfg.model.factory
        or cfg.data.factory
        or cfg.data.collate
        or strategy_names.info(cfg.strategy).parse_check
    )
    if probe:
        _probe(
            python or sys.executable,
            [*(["--strategy", strategy] if strategy else []), *args],
            nodes=nodes,
            gpus=gpus,
            where=where,
        )
    t = cfg.train
    return {
        "strategy": cfg.strategy,
        "global_batch": t.global_batch,
        "micro_batch": t.micro_batch,
        "grad_accum": accum,
        "max_steps": t.max_steps,
        "world_size": world,
        "dp": world // (cfg.parallel.tp * cfg.parallel.pp),  # tp and pp peers share a batch
        "tp": cfg.parallel.tp,
        "pp": cfg.parallel.pp,
        # for the snapshot memory plan (hpctrain/plan/snapshots.py): None = a factory's model
        "params": cfg.model.demo_params(),
        "optimizer": _optimizer(cfg.optim.name, cfg.optim.momentum),
        "snapshot_every": cfg.snapshot.every_steps,
        "snapshot_budget": cfg.snapshot.budget,
    }, (None if cfg.train.tracker != "none" else probe)  # None: check again every time


def _optimizer(name: str, momentum: float) -> str:
    """train_entry's optimizer as the plan names it (hpctrain.plan.OPTIMIZERS)."""
    return "sgd-momentum" if name == "sgd" and momentum > 0 else name


def _check_domain(tp: int, gpus: int, domain: int | None) -> None:
    """Tensor parallel inside the profile's fast-link domain when it is smaller than a node (two
    NVLink islands of 4 in an 8-GPU node); the node bound itself is kernel.mesh's check."""
    if domain is None or domain >= gpus or tp <= 1 or domain % tp == 0:
        return
    fits = ", ".join(str(d) for d in range(1, domain + 1) if domain % d == 0)
    raise UserError(
        f"--parallel.tp: tp({tp}) does not divide the profile's fast-link domain "
        f"(slurm.gpus_per_domain: {domain} GPUs): tensor parallel must stay inside it; set "
        f"--parallel.tp to one of {fits}"
    )


def _probe(python: str, args: list[str], *, nodes: int, gpus: int, where: str) -> None:
    """`python -m train_entry --check`: imports the factories and DeepSpeed, as a rank would."""
    env = {
        **os.environ,
        "WORLD_SIZE": str(nodes * gpus),
        "RANK": "0",
        ENV_NNODES: str(nodes),
        ENV_GPUS: str(gpus),
    }
    import subprocess  # lazy: CLI start-up: the probe only (factories, DeepSpeed)

    try:
        res = subprocess.run(
            [python, "-m", "train_entry", "--check", *args],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UserError(
            f"could not check train_entry's config ({e}); is {python} the right Python?"
        ) from None
    if res.returncode != 0:
        lines = [x for x in res.stderr.strip().splitlines() if x.strip()]
        first = next((x for x in lines if x.startswith("error:")), lines[-1] if lines else "")
        raise UserError(
            f"train_entry's config does not work {where}:\n  "
            f"{first.removeprefix('error: ')}\nnothing was queued"
        )


def _one(e: UserError) -> str:
    return e.format_message().replace("\n", "\n  ")


def describe(resolved: Resolved) -> str:
    world, dp = resolved["world_size"], resolved["dp"]
    ranks = f"world {world}" if dp == world else f"dp {dp} (world {world} / tp x pp)"
    return (
        f"global batch {resolved['global_batch']} = {ranks} x micro "
        f"{resolved['micro_batch']} x accum {resolved['grad_accum']}, "
        f"{resolved['max_steps']} steps"
    )
