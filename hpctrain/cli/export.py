"""export: thin command over hpctrain.service.export (torch is imported there, only when it writes)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from hpctrain.cli.complete import run_names
from hpctrain.cli.table import printable
from hpctrain.kernel.errors import UserError
from hpctrain.remote.forward import maybe_forward
from hpctrain.service.export import DTYPES, FORMATS, MAX_SHARD
from hpctrain.service.export import export as run_export


def _warn(msg: str) -> None:
    click.echo(f"warning: {printable(msg)}", err=True)


@click.command()
@click.argument("run", shell_complete=run_names)
@click.option(
    "--step", type=int, help="The checkpoint of this step (default: the newest verified)."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="safetensors",
    show_default=True,
    help="safetensors (model.safetensors) or torch (pytorch_model.bin, a torch.save dict).",
)
@click.option(
    "--dtype",
    type=click.Choice(DTYPES),
    help="Cast floating-point weights to this type (default: as saved, fp32 for DeepSpeed).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="The folder to create (must not exist; default RUN/export/step-<N>-<format>[-<dtype>]).",
)
@click.option(
    "--max-shard-size",
    default=MAX_SHARD,
    show_default=True,
    help="Above this, Hugging Face-style shards with an index json (5GB, 500MB, 2GiB).",
)
@click.option(
    "--runs-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to look for runs by name (default ./runs, then the run index).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def export(
    run: str,
    step: int | None,
    fmt: str,
    dtype: str | None,
    out: Path | None,
    max_shard_size: str,
    runs_dir: Path | None,
    as_json: bool,
) -> None:
    """Write a run's model weights from a verified checkpoint (newest by default) as files that
    safetensors, torch.load and Hugging Face's from_pretrained read without hpctrain: consolidated
    from DDP, FSDP2 or DeepSpeed ZeRO 0-3, one file, or shards with an index above
    --max-shard-size. A transformers model (your model.factory returns a PreTrainedModel) also
    gets its config.json: the folder is a save_pretrained folder. RUN is a run name, a run folder,
    or a `torchrun -m train_entry --run-dir` folder. Nothing is written on bad input (exit 2).

    \b
    Examples:
      hpctrain export demo                                 # runs/demo/export/step-<N>-safetensors/
      hpctrain export demo --step 500 --dtype bf16 --out weights/demo-500
      hpctrain export demo --format torch --max-shard-size 2GB --json
    \b
    Then, without hpctrain:
      safetensors.torch.load_file("weights/demo-500/model.safetensors")
      AutoModelForCausalLM.from_pretrained("weights/demo-500")   # a transformers model
    """
    maybe_forward("export", run, runs_dir)  # a run submitted to a site: exported there

    try:
        done = run_export(
            run,
            fmt=fmt,
            step=step,
            dtype=dtype,
            out=out,
            max_shard_size=max_shard_size,
            runs_dir=runs_dir,
            warn=_warn,
        )
    except UserError as e:  # it may quote a file name or text from the checkpoint folder
        raise UserError(printable(e.message)) from None
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(done), indent=2))
        return
    what = "a Hugging Face folder" if done.huggingface else f"{done.format} weights"
    files = done.index or done.files[0]
    more = f" ({len(done.files)} files)" if len(done.files) > 1 else ""
    head = (
        f"exported {done.run} step {done.step} ({done.strategy}) as {what}, "
        f"{done.tensors} tensors, {done.bytes / 1e6:.1f} MB ({done.dtype}):"
    )
    where = f"{done.out}/{files}{more}"
    click.echo(f"{printable(head)}\n  {printable(where)}")
    if done.skipped:
        _warn(f"left out (not tensors): {', '.join(done.skipped)}")
