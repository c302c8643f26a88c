"""Prepare a run: the profile, the request, the run folder and the rendered script that `render`,
`submit` and the remote path agree on. Nothing is written here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.jobs import entry_check
from hpctrain.jobs.entry_check import Resolved, describe
from hpctrain.jobs.options import JobOptions
from hpctrain.jobs.request import JobRequest
from hpctrain.jobs.spec import JobSpec, node_python
from hpctrain.kernel import strategies
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.snapshot import BUDGET as DEFAULT_BUDGET
from hpctrain.kernel.yamlsafe import yaml_scalar
from hpctrain.profiles import resolve
from hpctrain.render.script import render
from hpctrain.runs.folder import RunDir, runs_dir_of

if TYPE_CHECKING:
    # hpctrain.plan is imported where --strategy auto or a dry run needs it (CLI start-up; it may
    # be absent)
    from hpctrain.plan.ladder import Plan, Recommendation
    from hpctrain.plan.snapshots import SnapshotPlan
    from hpctrain.profiles.resolved import ResolvedProfile


def flags(
    partition: str | None,
    account: str | None,
    qos: str | None,
    sets: tuple[str, ...],
    spare_nodes: int | None = None,
    gpu_type: str | None = None,
) -> dict[str, object]:
    """The command line's profile overrides: --set KEY=VALUE and the --partition/--account/--qos/
    --spare-nodes/--gpu-type shortcuts, as a flags layer (hpctrain.profiles.resolve)."""
    out: dict[str, object] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set {item!r}: write KEY=VALUE, e.g. --set slurm.mem=0")
        # An environment variable's value is text as typed (`--set environment.env.X=true`).
        text_key = key.startswith(("environment.env.", "network.env."))
        out[key] = value if text_key else _scalar(value)
    shortcuts = {"partition": partition, "account": account, "qos": qos, "gpu_type": gpu_type}
    for key, given in shortcuts.items():
        if given is not None:
            out[f"slurm.{key}"] = given
    if spare_nodes is not None:
        out["preemption.spare_nodes"] = spare_nodes
    return out


def _scalar(text: str) -> object:
    """--set values are YAML scalars (numbers, booleans, null), as in a profile file."""
    return yaml_scalar(text)


def resolve_profile(o: JobOptions) -> ResolvedProfile:
    return resolve(
        o.profile, flags(o.partition, o.account, o.qos, o.sets, o.spare_nodes, o.gpu_type)
    )


class Prepared:
    """Everything submit and render agree on: the profile, the request, the run folder, the job's
    spec (built once) and its script."""

    def __init__(
        self, o: JobOptions, profile: ResolvedProfile | None = None, *, chain: bool = False
    ) -> None:
        self.profile = profile or resolve_profile(o)
        strategy, args = o.strategy, tuple(o.args)
        ours = not (o.script or o.module)  # the bundled train_entry
        if ours:
            entry_check.refuse_owned(args)
            if strategy != "auto":
                strategy = entry_check.one_source(strategy, args)
                # train_entry's argv carries --strategy once (jobs.request.Entry.argv), not again
                args = entry_check.without_flag(args, "strategy") if strategy else args
        self.plan: Recommendation | None = None
        self.planned: Plan | None = None  # the whole plan (its workload: the model's size)
        if strategy == "auto":
            self.planned = planned(self.profile, o)
            self.plan = self.planned.recommendation
            assert self.plan is not None  # planned() raised when nothing fits
            strategy = self.plan.strategy
            if not (o.script or o.module):  # train_entry takes the plan's settings as flags
                for key in _planned_from(args):  # the plan started from these and chose
                    args = entry_check.without_flag(args, key)
                args = (*plan_args(self.plan), *batch_args(self.planned), *args)
        explicit = strategy  # None: train_entry's own (its --config), else this one
        self.request = JobRequest.build(
            self.profile,
            name=o.name,
            nodes=o.nodes,
            gpus=o.gpus,
            time_min=o.time_min,
            strategy=strategy,
            script=o.script,
            module=o.module,
            args=args,
            min_nodes=o.min_nodes,
            exclude=tuple(o.exclude or ()),
        )
        self.resolved: Resolved | None = None
        self.note = ""  # one line the user should read (a strategy picked for the layout)
        if ours:  # validated at the requested world size before anything is queued
            self.resolved = entry_check.check_train_entry(
                nodes=self.request.nodes,
                gpus=self.request.gpus,
                args=args,
                strategy=explicit,
                domain=self.profile.slurm.gpus_per_domain,
            )
            if self.resolved["strategy"] != self.request.strategy:  # e.g. `strategy:` in --config
                self.request = self.request.with_strategy(self.resolved["strategy"])
            self.note = _default_mesh_note(explicit, args, self.resolved)
        self.run = RunDir(runs_dir_of(self.profile) / self.request.name)
        self.python = node_python(self.profile)
        self.chain = chain
        self.use(self.request)

    def use(self, request: JobRequest) -> None:
        """Build the spec of `request` (checked) and render its script."""
        self.request = request
        self.spec = JobSpec.build(
            self.profile, request, self.run.path, python=self.python, chain=self.chain
        )
        self.script = render(self.spec)


def entry_line(p: Prepared) -> str:
    if p.resolved is None:
        return f"entry {p.request.entry.kind} {p.request.entry.target}"
    note = p.note or (_auto_note(p.plan) if p.plan else "")
    note = f" ({note})" if note else ""
    return f"strategy {p.request.strategy}{note}, {describe(p.resolved)}"


def _auto_note(rec: Recommendation) -> str:
    """What --strategy auto carried into the run besides the strategy (batch_args, plan_args)."""
    parts = [f"auto: {rec.name}"]
    if rec.tp > 1 or rec.pp > 1:
        parts.append(f"tp {rec.tp} x pp {rec.pp} x dp {rec.dp}")
        if rec.pp > 1:
            parts.append(f"{rec.schedule}, {rec.microbatches} pipeline micro-batches")
    if rec.zero_stage is not None:
        parts.append(f"ZeRO-{rec.zero_stage}")
    if rec.offload != "none":
        parts.append(f"offload {rec.offload}")
    parts.append(rec.precision)
    parts.append("activation checkpointing" if rec.activation_checkpointing else "no checkpointing")
    return ", ".join(parts)


def _default_mesh_note(explicit: str | None, args: tuple[str, ...], r: Resolved) -> str:
    """The line that says train_entry took fsdp for a layout asked with the strategy left at its
    default (train_entry/config/load.py); '' when the strategy was given (or a --config may
    have set it)."""
    if explicit or entry_check.entry_flag(args, "config") is not None:
        return ""
    if r["strategy"] != strategies.MESH or (r["tp"] == 1 and r["pp"] == 1):
        return ""
    sizes = {"tp": r["tp"], "pp": r["pp"]}
    layout = " ".join(f"--parallel.{k} {v}" for k, v in sizes.items() if v > 1)
    return (
        f"picked for {layout}: {strategies.DEFAULT}, the default, does not compose with tp/pp, "
        f"{strategies.MESH} is the mesh's data-parallel dimension"
    )


def plan_args(rec: Recommendation) -> list[str]:
    """train_entry flags for a plan's ZeRO stage, offload and tp x pp mesh (the user's own flags,
    after, win)."""
    tp, pp = getattr(rec, "tp", 1), getattr(rec, "pp", 1)
    if tp > 1 or pp > 1:
        mesh = [f"--parallel.tp={tp}", f"--parallel.pp={pp}"]
        if pp > 1:
            mesh.append(f"--parallel.schedule={rec.schedule}")
            if getattr(rec, "microbatches", None):
                mesh.append(f"--parallel.microbatches={rec.microbatches}")
        return mesh
    info, name = strategies.info(rec.strategy), rec.strategy
    if info.zero:  # the ZeRO stage and where the engine offloads to
        out = [f"--{name}.zero_stage={rec.zero_stage or 0}"]
        device = "nvme" if rec.offload == "nvme" else "cpu"
        if rec.offload != "none":
            out.append(f"--{name}.offload_optimizer={device}")
        if rec.offload in ("optimizer+params", "nvme") and rec.zero_stage == 3:
            out.append(f"--{name}.offload_param={device}")
        return out
    if info.cpu_offload and rec.offload != "none":
        return [f"--{name}.cpu_offload=true"]
    return []


# train_entry keys --strategy auto plans from (the user's value, else its assumption) and sets
PLANNED = ("train.precision", "train.micro_batch", "train.global_batch")
PRECISIONS = ("fp32", "bf16", "fp16")  # hpctrain.plan.PRECISIONS (imported where it is used)


def batch_args(planned: Plan) -> list[str]:
    """train_entry flags for what the plan estimated besides the layout: the precision, the
    activation checkpointing and the batch (micro-batch per GPU, global batch = dp x micro x
    accumulation; under pp one pipeline pass of micro x microbatches per step)."""
    rec, wl = planned.recommendation, planned.workload
    assert rec is not None
    out = [f"--train.precision={rec.precision}"]
    if rec.activation_checkpointing:
        out.append("--train.activation_checkpointing=true")
    micro, accum = rec.micro_batch or 1, rec.grad_accumulation
    if rec.pp > 1:
        micro, accum = micro * (rec.microbatches or 1), 1
    dp = rec.dp or wl.world
    return [*out, f"--train.micro_batch={micro}", f"--train.global_batch={dp * micro * accum}"]


def _planned_from(args: tuple[str, ...]) -> list[str]:
    """The PLANNED keys the user gave with a value the plan used (a bad one stays for
    train_entry's check to name)."""
    precision = entry_check.entry_flag(args, "train.precision")
    used = {"train.precision": precision in PRECISIONS}
    used |= {key: _entry_int(args, key) is not None for key in PLANNED[1:]}
    return [key for key in PLANNED if used[key]]


def _entry_int(args: tuple[str, ...], key: str) -> int | None:
    """An integer train_entry flag the plan should use (`--train.micro_batch 4`); None when
    absent or not a number (train_entry's own check names it)."""
    text = entry_check.entry_flag(args, key)
    return int(text) if text is not None and text.isdigit() and int(text) > 0 else None


def plan(profile: ResolvedProfile, o: JobOptions) -> Recommendation:
    """The strategy of --strategy auto (hpctrain.plan.recommend); UserError when nothing fits."""
    rec = planned(profile, o).recommendation
    assert rec is not None  # planned() raised when nothing fits
    return rec


def planned(profile: ResolvedProfile, o: JobOptions) -> Plan:
    """`hpctrain plan` for --strategy auto, the whole plan (its workload holds the model's size);
    UserError when nothing fits."""
    try:
        # lazy: CLI start-up: the planner for --strategy auto only
        from hpctrain.plan import make_plan, no_fit_message, workload
    except ImportError:
        raise UserError(
            "--strategy auto needs hpctrain.plan, which is not available in this install; "
            "choose --strategy ddp, fsdp or deepspeed"
        ) from None
    ours = not (o.script or o.module)
    model = o.plan_model
    if model is None and o.params is None and ours:  # train_entry's own `--model pkg.mod:fn`
        model = entry_check.entry_flag(o.args, "model")
    if o.params is None and model is None:
        raise UserError(
            "--strategy auto needs the model size: add --params N (parameter count) or "
            "--model pkg.mod:factory"
        )
    source = profile.source
    # what the user gave train_entry is what the plan estimates (bf16 unless told otherwise)
    precision = entry_check.entry_flag(o.args, "train.precision") if ours else None
    result = make_plan(
        workload(
            params=o.params,
            model=model,
            precision=precision if precision in PRECISIONS else "bf16",
            micro_batch=_entry_int(o.args, "train.micro_batch") if ours else None,
            global_batch=_entry_int(o.args, "train.global_batch") if ours else None,
            optimizer="adamw",
            nodes=o.nodes or 1,
            gpus=o.gpus or (profile.slurm.gpus_per_node or 1),
            # from the resolved profile, so `--set slurm.KEY=V` counts
            gpu_mem_gib=profile.slurm.gpu_mem_gib,
            domain=profile.slurm.gpus_per_domain,
            inter_gbps=profile.preflight.expected_busbw_gbps,
            profile=str(source) if source else profile.name,
        )
    )
    if result.recommendation is None:
        raise UserError(no_fit_message(result))
    return result


def snapshot_plan(p: Prepared) -> SnapshotPlan | None:
    """The run's in-memory snapshots and their node-local memory (hpctrain/plan/snapshots.py):
    the model's size from train_entry's config (the demo GPT), else from the plan of --strategy
    auto (--params/--model), else measured at the first snapshot. None without hpctrain.plan."""
    try:
        from hpctrain.plan import model, snapshots  # lazy: CLI start-up: dry runs only
    except ImportError:
        return None
    r, rec = p.resolved, p.plan
    params = r["params"] if r else None  # train_entry's demo GPT; None for its model factory
    if params is None and p.planned is not None:
        params = p.planned.workload.params  # --params/--model of --strategy auto
    slurm = p.profile.slurm
    mem = snapshots.node_memory_gib(
        slurm.mem, gpu_mem_gib=slurm.gpu_mem_gib, gpus=slurm.gpus_per_node
    )
    return snapshots.plan_snapshots(
        # a --script/--module holds what it hands hpctrain.runtime: its size is not known before
        strategy=p.request.strategy if p.resolved is not None or rec else "script",
        params=params,
        nodes=p.request.nodes,
        gpus=p.request.gpus,
        optimizer=r["optimizer"] if r else "adamw",
        tp=r["tp"] if r else rec.tp if rec else 1,
        pp=r["pp"] if r else rec.pp if rec else 1,
        node_mem_bytes=None if mem is None else int(mem * model.GIB),
        gpu_mem_bytes=int(slurm.gpu_mem_gib * model.GIB) if slurm.gpu_mem_gib else None,
        every_steps=r["snapshot_every"] if r else None,
        budget=r["snapshot_budget"] if r else DEFAULT_BUDGET,
    )
