"""`hpctrain plan`: memory per GPU under every strategy, and the one to use."""

from __future__ import annotations

import click

from hpctrain.plan import OPTIMIZERS, PRECISIONS, gib, make_plan, no_fit_message, workload


class Count(click.ParamType):
    """A parameter count as people write it: 7000000000, 7e9, 1.3e9, 7B, 350M, 125k."""

    name = "count"
    _SCALE = {"k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}

    def convert(self, value, param, ctx):  # type: ignore[no-untyped-def]
        if isinstance(value, int):
            return value
        text = str(value).strip().replace("_", "").replace(",", "")
        scale = self._SCALE.get(text[-1:].lower(), 1)
        try:
            n = round(float(text[:-1] if scale != 1 else text) * scale)
        except ValueError:
            n = 0
        if n < 1:
            self.fail(
                f"{value!r} is not a parameter count; write e.g. 7000000000, 7e9 or 7B", param, ctx
            )
        return n


@click.command()
@click.option(
    "--params", type=Count(), help="Number of model parameters: 7000000000, 7e9, 7B, 350M."
)
@click.option(
    "--model",
    metavar="PKG.MOD:FACTORY",
    help="Count the parameters of this factory's model, built on the meta device.",
)
@click.option("--precision", type=click.Choice(PRECISIONS), default="bf16", show_default=True)
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="adamw", show_default=True)
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True)
@click.option(
    "--gpus", type=click.IntRange(min=1), default=1, show_default=True, help="GPUs per node."
)
@click.option(
    "--gpu-mem-gib",
    type=click.FloatRange(min=0, min_open=True),
    help="Memory per GPU (default: the profile's slurm.gpu_mem_gib).",
)
@click.option("--profile", help="Site profile to read GPU (and host) memory from.")
@click.option(
    "--host-mem-gib",
    type=click.FloatRange(min=0, min_open=True),
    help="Host memory per node for offload (default: the profile's slurm.mem; else unchecked).",
)
@click.option("--micro-batch", type=click.IntRange(min=1), help="Sequences per GPU per micro-step.")
@click.option("--seq-len", type=click.IntRange(min=1), help="Tokens per sequence.")
@click.option("--hidden", type=click.IntRange(min=1), help="Model width (d_model).")
@click.option("--layers", type=click.IntRange(min=1), help="Transformer layers.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(
    params,
    model,
    precision,
    optimizer,
    nodes,
    gpus,
    gpu_mem_gib,
    profile,
    host_mem_gib,
    micro_batch,
    seq_len,
    hidden,
    layers,
    as_json,
) -> None:
    """Estimate memory per GPU for DDP, ZeRO-1/2/3, FSDP and offload, and recommend one.

    Walks the out-of-memory ladder (smaller micro-batch -> mixed precision -> activation
    checkpointing -> ZeRO-2 -> FSDP/ZeRO-3 -> CPU offload -> NVMe offload) and picks the first rung
    that fits with 12% headroom plus 1 GiB for the CUDA context. Activations are counted only when
    --micro-batch, --seq-len, --hidden and --layers are all given. Exit 1 when nothing fits.

    \b
    Examples:
      hpctrain plan --params 7e9 --nodes 2 --gpus 8 --gpu-mem-gib 80
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


def _print_table(result) -> None:
    from rich.console import Console
    from rich.table import Table

    wl = result.workload
    import shutil

    # the table needs about 110 columns; never truncate figures in a narrow or piped terminal
    console = Console(highlight=False, width=max(shutil.get_terminal_size().columns, 112))
    title = (
        f"{wl.params:,} parameters, {wl.precision}, {wl.optimizer}, {wl.nodes} node(s) x "
        f"{wl.gpus} GPU(s), {gib(wl.gpu_mem_bytes)} per GPU ({gib(wl.usable_bytes)} usable)"
    )
    table = Table(
        title=title,
        title_justify="left",
        caption="GiB per GPU (host: per node); * = recommended",
        caption_justify="left",
        pad_edge=False,
        box=None,
    )
    for col in (
        "strategy",
        "params",
        "grads",
        "optim",
        "state",
        "gather",
        "act",
        "act ckpt",
        "host",
        "fits",
        "ckpt fits",
    ):
        table.add_column(col, justify="left" if col == "strategy" else "right", no_wrap=True)
    rec = result.recommendation
    for e in result.estimates:
        mark = " *" if rec and rec.name == e.name else ""
        table.add_row(
            e.name + mark,
            *(
                _g(n)
                for n in (
                    e.params_bytes,
                    e.grads_bytes,
                    e.optimizer_bytes,
                    e.model_state_bytes_per_gpu,
                    e.transient_bytes,
                    e.activation_bytes_per_gpu,
                    e.activation_bytes_per_gpu_checkpointed,
                    e.host_bytes_per_node,
                )
            ),
            "yes" if e.fits else "no",
            "yes" if e.fits_with_checkpointing else "no",
        )
    console.print(table)
    if not wl.has_activations:
        console.print(
            "activations not counted: give --micro-batch, --seq-len, --hidden and --layers"
        )
    if rec is None:
        console.print(f"[bold red]nothing fits[/]: {no_fit_message(result)}")
        return
    opts = [f"--strategy {rec.strategy}"]
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
    console.print(f"[bold]recommended: {rec.name}[/] ({', '.join(opts)})")
    console.print(f"why: {rec.reason}")
