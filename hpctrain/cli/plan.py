"""`hpctrain plan`: memory per GPU under every strategy, and the one to use."""

from __future__ import annotations

import shutil

import click
from rich.console import Console
from rich.table import Table

from hpctrain.cli.complete import profile_names
from hpctrain.cli.types import Count
from hpctrain.cli.types import flag_of as _flag
from hpctrain.kernel.errors import UserError
from hpctrain.plan import OPTIMIZERS, PRECISIONS, Plan, gib, make_plan, no_fit_message, workload
from hpctrain.plan.ladder import for_plan
from hpctrain.plan.parallel import SCHEDULES


class Gib(click.ParamType):  # type: ignore[type-arg]  # as Count
    """GiB of memory: any number here; hpctrain.plan.inputs.check_sizes bounds it (inf, nan)."""

    name = "gib"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            return float(str(value))
        except (TypeError, ValueError):
            raise UserError(
                f"{_flag(param)} {str(value)[:40]!r}: give the memory in GiB (80 for an 80 GiB GPU)"
            ) from None


@click.command()
@click.option(
    "--params", type=Count(), help="Number of model parameters: 7000000000, 7e9, 7B, 350M."
)
@click.option(
    "--model",
    metavar="PKG.MOD:FACTORY|hf:FOLDER",
    help="Count the parameters of this factory's model, built on the meta device; hf:FOLDER: "
    "of a Hugging Face folder, from its safetensors headers (its width and layers too).",
)
@click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True)
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="adamw", show_default=True)
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--gpus", type=click.IntRange(min=1), default=1, show_default=True, help="GPUs per node."
)
@click.option(
    "--gpu-mem-gib",
    type=Gib(),
    help="Memory per GPU (default: the profile's slurm.gpu_mem_gib).",
)
@click.option(
    "--profile",
    help="Site profile to read GPU (and host) memory from.",
    shell_complete=profile_names,
)
@click.option(
    "--host-mem-gib",
    type=Gib(),
    help="Host memory per node for offload (default: the profile's slurm.mem; else unchecked).",
)
@click.option("--micro-batch", type=click.IntRange(min=1), help="Sequences per GPU per micro-step.")
@click.option("--seq-len", type=click.IntRange(min=1), help="Tokens per sequence.")
@click.option("--hidden", type=click.IntRange(min=1), help="Model width (d_model).")
@click.option("--layers", type=click.IntRange(min=1), help="Transformer layers.")
@click.option("--heads", type=click.IntRange(min=1), help="Attention heads.")
@click.option(
    "--global-batch",
    type=click.IntRange(min=1),
    help="Sequences per optimizer step (default: GPUs x micro-batch); sets the pipeline's "
    "micro-batches.",
)
@click.option(
    "--schedule",
    type=click.Choice(SCHEDULES),
    default="1f1b",
    show_default=True,
    help="Pipeline schedule for the tp x pp layouts.",
)
@click.option(
    "--domain",
    type=click.IntRange(min=1),
    help="GPUs joined by NVLink (tensor parallel stays inside; default: the profile's "
    "slurm.gpus_per_domain, else --gpus).",
)
@click.option(
    "--inter-gbps",
    type=Gib(),
    help="Bus bandwidth between nodes in GB/s, as nccl-tests report it (default: the profile's "
    "preflight.expected_busbw_gbps, else 100 assumed).",
)
@click.option(
    "--intra-gbps", type=Gib(), help="Bus bandwidth inside a node, GB/s (default 300 assumed)."
)
@click.option(
    "--tflops", type=Gib(), help="Effective TFLOP/s per GPU for the step estimate (default 300)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(
    params: int | None,
    model: str | None,
    precision: str,
    optimizer: str,
    nodes: int,
    gpus: int,
    gpu_mem_gib: float | None,
    profile: str | None,
    host_mem_gib: float | None,
    micro_batch: int | None,
    seq_len: int | None,
    hidden: int | None,
    layers: int | None,
    heads: int | None,
    global_batch: int | None,
    schedule: str,
    domain: int | None,
    inter_gbps: float | None,
    intra_gbps: float | None,
    tflops: float | None,
    as_json: bool,
) -> None:
    """Estimate memory per GPU for DDP, ZeRO-1/2/3, FSDP, tensor x pipeline parallel and offload,
    and recommend one.

    Walks the out-of-memory ladder (smaller micro-batch -> mixed precision -> activation
    checkpointing -> DDP -> FSDP -> tensor x pipeline x FSDP -> CPU offload -> NVMe offload) with
    12% headroom plus 1 GiB for the CUDA context, and weighs what fits by an estimated step time:
    the compute, the bubble, and the bytes each GPU sends per step inside and between nodes over
    --intra-gbps / --inter-gbps. A tp x pp layout wins over data parallel when it saves at least
    10% of the step; ZeRO-2 (DeepSpeed, an optional install) is shown, FSDP preferred. The shape
    (--layers, --hidden, --heads, --seq-len, --micro-batch) is assumed from the parameter count
    where not given. Exit 1 when nothing fits.

    \b
    Examples:
      hpctrain plan --params 7e9 --nodes 2 --gpus 8 --gpu-mem-gib 80
      hpctrain plan --params 405e9 --nodes 16 --gpus 8 --gpu-mem-gib 80 --seq-len 8192
      hpctrain plan --model mypkg.models:gpt_small --profile mycluster --nodes 1 --gpus 4 \\
          --micro-batch 8 --seq-len 2048 --hidden 2048 --layers 24 --json
    """
    wl = workload(
        params=params,
        model=model,
        precision=precision,
        optimizer=optimizer,
        nodes=nodes,
        gpus=gpus,
        gpu_mem_gib=gpu_mem_gib,
        profile=profile,
        micro_batch=micro_batch,
        seq_len=seq_len,
        hidden=hidden,
        layers=layers,
        host_mem_gib=host_mem_gib,
        heads=heads,
        global_batch=global_batch,
        schedule=schedule,
        domain=domain,
        inter_gbps=inter_gbps,
        intra_gbps=intra_gbps,
        tflops=tflops,
    )
    result = make_plan(wl)
    if as_json:
        click.echo(result.to_json())
    else:
        _print_table(result)
    if result.recommendation is None:
        raise SystemExit(1)


def _g(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024**3:.2f}"


def _print_table(result: Plan) -> None:
    wl = result.workload
    # the table needs about 110 columns; never truncate figures in a narrow or piped terminal
    console = Console(highlight=False, width=max(shutil.get_terminal_size().columns, 112))
    console.print(_strategies(result))
    _print_parallel(console, result)
    shape = (
        f"{wl.layers} layers, hidden {wl.hidden}, {wl.heads} heads, seq {wl.seq_len}, "
        f"micro-batch {wl.micro_batch}"
    )
    if wl.assumed:
        flags = ", ".join("--" + a.replace("_", "-") for a in wl.assumed)
        console.print(f"shape: {shape}; assumed from the parameter count: give {flags} for yours")
    else:
        console.print(f"shape: {shape}")
    rec = result.recommendation
    if rec is None:
        console.print(f"[bold red]nothing fits[/]: {no_fit_message(result)}")
        return
    console.print(f"[bold]recommended: {rec.name}[/] ({', '.join(_settings(result))})")
    console.print(f"why: {rec.reason}")
    if rec.pp > 1:
        mb = (rec.micro_batch or 1) * (rec.microbatches or 1)
        console.print(
            f"train_entry runs one pipeline pass per micro-step: for this bubble give "
            f"--parallel.microbatches {rec.microbatches} --train.micro_batch {mb} (default: pp "
            "micro-batches per pass, bubble (p-1)/(2p-1))"
        )
    if rec.offload_lost:
        console.print(f"offload lost: {rec.offload_lost}")
    snapshots = for_plan(result)
    if snapshots is not None:
        console.print(snapshots.line(), markup=False)


def _strategies(result: Plan) -> Table:
    """Memory per GPU under each strategy; * marks the recommended one."""
    wl = result.workload
    title = (
        f"{wl.params:,} parameters, {wl.precision}, {wl.optimizer}, {wl.nodes} node(s) x "
        f"{wl.gpus} GPU(s), {gib(wl.gpu_mem_bytes)} per GPU ({gib(wl.usable_bytes)} usable)"
    )
    table = Table(
        title=title,
        title_justify="left",
        caption="GiB per GPU (host: per node; between: sent per GPU per step between nodes, as "
        "asked); * = recommended",
        caption_justify="left",
        pad_edge=False,
        box=None,
    )
    cols = ("params", "grads", "optim", "state", "gather", "act", "act ckpt", "host", "between")
    table.add_column("strategy", justify="left", no_wrap=True)
    for col in (*cols, "fits", "ckpt fits"):
        table.add_column(col, justify="right", no_wrap=True)
    rec = result.recommendation
    for e in result.estimates:
        sizes = (
            e.params_bytes,
            e.grads_bytes,
            e.optimizer_bytes,
            e.model_state_bytes_per_gpu,
            e.transient_bytes,
            e.activation_bytes_per_gpu,
            e.activation_bytes_per_gpu_checkpointed,
            e.host_bytes_per_node,
            result.between_nodes(e),
        )
        mark = " *" if rec and rec.name == e.name else ""
        fits = ("yes" if e.fits else "no", "yes" if e.fits_with_checkpointing else "no")
        table.add_row(*[e.name + mark, *map(_g, sizes), *fits])
    return table


def _settings(result: Plan) -> list[str]:
    """The recommended rung's settings, as a user passes them."""
    rec, wl = result.recommendation, result.workload
    assert rec is not None
    opts = [f"--strategy {rec.strategy}"]
    if rec.tp > 1 or rec.pp > 1:
        opts.append(f"--parallel.tp {rec.tp} --parallel.pp {rec.pp}")
    if rec.pp > 1:
        opts.append(f"{rec.schedule}, {rec.microbatches} micro-batches, bubble {rec.bubble:.1%}")
    if rec.zero_stage is not None:
        opts.append(f"zero_stage={rec.zero_stage}")
    if rec.offload != "none":
        opts.append(f"offload={rec.offload}")
    if rec.activation_checkpointing:
        opts.append("activation checkpointing")
    if rec.precision != wl.precision:
        opts.append(f"precision {rec.precision}")
    if rec.micro_batch and rec.micro_batch != wl.micro_batch:
        opts.append(f"micro-batch {rec.micro_batch} x accumulation {rec.grad_accumulation}")
    return opts


def _print_parallel(console: Console, result: Plan, rows: int = 6) -> None:
    """The best tensor x pipeline x FSDP layouts (those that fit first)."""
    if not result.parallel:
        return
    table = Table(
        title="tensor x pipeline x data parallel (FSDP over dp), best first",
        title_justify="left",
        caption="GiB per GPU; between nodes: GiB each GPU sends per step over the slowest link; "
        "step: the estimated step time",
        caption_justify="left",
        pad_edge=False,
        box=None,
    )
    cols = ("layout", "state", "gather", "act", "total", "ckpt", "bubble", "between nodes")
    for col in (*cols, "step", "fits"):
        table.add_column(col, justify="left" if col == "layout" else "right", no_wrap=True)
    rec = result.recommendation
    for c in result.parallel[:rows]:
        mark = " *" if rec and rec.name == c.name else ""
        sizes = (
            c.params_bytes + c.grads_bytes + c.optimizer_bytes,
            c.transient_bytes,
            c.activation_bytes,
            c.total_bytes_per_gpu,
        )
        ckpt = "yes" if c.activation_checkpointing else "no"
        fits = "yes" if c.fits else "no"
        cells = [c.name + mark, *map(_g, sizes), ckpt, f"{c.bubble:.1%}"]
        table.add_row(*cells, _g(c.slow_bytes_per_step), f"{c.step_s:.2f} s", fits)
    console.print(table)
