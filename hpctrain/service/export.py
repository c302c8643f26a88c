"""export: a run's model weights, from a verified checkpoint, as files that load without hpctrain.

The checks (which run, which checkpoint, where to write) are here and need no torch; the reading and
writing is train_entry/checkpoint/export.py (imports torch, and DeepSpeed for its checkpoints).
Bad input is one line and exit 2, before anything is written; an existing path is never written
into, and a failed export leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from hpctrain.kernel import layout
from hpctrain.kernel.checkpoint import newest_verified, step_folders, step_name, verify
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.rundir import RunFolder
from hpctrain.runs.folder import find_run

FORMATS = ("safetensors", "torch")
DTYPES = ("fp32", "bf16", "fp16")
MAX_SHARD = "5GB"  # Hugging Face's default shard size
MAX_SHARD_BYTES = 10**15  # a petabyte: beyond any model, where a typo's 400 digits stop
NAME_MAX, PATH_MAX = 255, 4096  # Linux's: bytes in one name, in a whole path
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text: str) -> int:
    """'5GB' (10^9), '500MiB' (2^20), '1000' (bytes) -> bytes (at most MAX_SHARD_BYTES)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    shown = text if len(text) <= 40 else f"{text[:24]}... ({len(text)} characters)"
    if m is None or unit not in _UNITS:
        raise UserError(
            f"--max-shard-size {shown!r}: give a size such as 5GB, 500MB or 2GiB (bytes without a unit)"
        )
    size = int(Decimal(m.group(1)) * _UNITS[unit])  # exact for any number of digits
    if not 0 < size <= MAX_SHARD_BYTES:
        raise UserError(
            f"--max-shard-size {shown!r}: a shard holds 1 byte to 1PB; give a size such as 5GB, "
            "500MB or 2GiB"
        )
    return size


def out_path(out: Path) -> Path:
    """--out as an absolute path, refused in one line when the filesystem could not hold it."""
    target = Path(out).expanduser().absolute()
    longest = max(target.parts, key=lambda p: len(os.fsencode(p)))
    if len(os.fsencode(longest)) > NAME_MAX or len(os.fsencode(str(target))) > PATH_MAX:
        raise UserError(
            f"--out {str(target)[:60]}... is too long for a path ({len(os.fsencode(longest))} "
            f"bytes in one name, {len(os.fsencode(str(target)))} in all; at most {NAME_MAX} and "
            f"{PATH_MAX}): give a shorter --out"
        )
    return target


def run_folder(ref: str, runs_dir: Path | None) -> Path:
    """A run by name or path (as `status` finds it), or any folder with a checkpoints/ folder
    (a `torchrun -m train_entry --run-dir DIR` run)."""
    direct = Path(ref).expanduser()
    if (direct / layout.CHECKPOINTS).is_dir() and not (direct / layout.RUN_YAML).is_file():
        return direct.resolve()

    return find_run(ref, runs_dir).path


def checkpoint(
    run: Path, step: int | None, warn: Callable[[str], None]
) -> tuple[Path, dict[str, object]]:
    """The checkpoint to export: step `step`, else the newest that verifies."""
    ckpt_dir = run / layout.CHECKPOINTS
    if step is None:
        found = newest_verified(ckpt_dir, warn=warn)
        if found is None:
            raise UserError(
                f"{run.name}: no verified checkpoint in {ckpt_dir}; a run saves one every "
                "checkpoint.every_steps steps and at its end (`hpctrain status` shows the newest)"
            )
        return found
    folder = ckpt_dir / step_name(step)
    if not folder.is_dir():
        steps = ", ".join(str(s) for s, _ in reversed(step_folders(ckpt_dir))) or "none"
        raise UserError(
            f"{run.name}: no checkpoint of step {step} in {ckpt_dir} (steps there: {steps}); "
            "give one of them to --step, or leave --step out for the newest"
        )
    manifest, why = verify(folder)
    if manifest is None:
        raise UserError(f"{folder} does not verify: {why}; export another --step")
    return folder, manifest


@dataclass(frozen=True)
class Exported:
    """What `export` wrote (`export --json`: these keys, in this order; docs/export.md)."""

    run: str
    run_dir: str
    checkpoint: str
    step: int
    strategy: object  # the manifest's
    format: str
    dtype: str  # "as saved" when not cast
    out: str
    files: list[str]  # in `out`
    index: str | None  # the shards' index json (None: one file)
    tensors: int
    bytes: int
    huggingface: bool  # a save_pretrained folder (config.json written)
    skipped: list[str]  # entries of the state that are not tensors


def export(
    ref: str,
    *,
    fmt: str,
    step: int | None = None,
    dtype: str | None = None,
    out: Path | None = None,
    max_shard_size: str = MAX_SHARD,
    runs_dir: Path | None = None,
    warn: Callable[[str], None] = lambda _: None,
) -> Exported:
    """Export one checkpoint's model weights; what was written (see docs/export.md)."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if dtype is not None and dtype not in DTYPES:
        raise UserError(f"--dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    limit = parse_size(max_shard_size)
    given = out_path(out) if out is not None else None
    run = run_folder(ref, runs_dir)
    folder, manifest = checkpoint(run, step, warn)
    got = manifest.get("step", -1)
    target = given or run / layout.EXPORT / f"{folder.name}-{fmt}{'-' + dtype if dtype else ''}"
    try:
        taken = target.exists() or target.is_symlink()
    except OSError as exc:
        raise UserError(
            f"--out {target}: cannot look there ({exc.strerror}); give an --out in a folder you "
            "can write"
        ) from None
    if taken:
        raise UserError(
            f"{target} exists: export never writes into an existing path; give another --out "
            "or move it away"
        )
    config = _config(folder)
    from train_entry.checkpoint.export import export as write  # lazy: torch on a torch-free path

    # one mode for every file of the export: inside a run folder, that folder's (storage.share)
    mask = RunFolder(run).mask() if target.is_relative_to(run) else None
    summary = write(
        folder, manifest, target, fmt=fmt, dtype=dtype, max_shard=limit, config=config, mask=mask
    )
    return Exported(
        run=run.name,
        run_dir=str(run),
        checkpoint=str(folder),
        step=int(got) if isinstance(got, int | str) else -1,
        strategy=manifest.get("strategy"),
        format=fmt,
        dtype=dtype or "as saved",
        out=str(target),
        files=_names(summary.get("files")),
        index=str(summary["index"]) if summary.get("index") else None,
        tensors=_count(summary.get("tensors")),
        bytes=_count(summary.get("bytes")),
        huggingface=bool(summary.get("huggingface")),
        skipped=_names(summary.get("skipped")),
    )


def _names(value: object) -> list[str]:
    return [str(x) for x in value] if isinstance(value, list) else []


def _count(value: object) -> int:
    return value if isinstance(value, int) else 0


def _config(folder: Path) -> dict[str, object] | None:
    """The run's train config saved with the checkpoint (train_entry's), if there is one."""
    try:
        data = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
