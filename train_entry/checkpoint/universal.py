"""DeepSpeed on another world size: the saved checkpoint converted to DeepSpeed's universal form
(deepspeed.checkpoint.ds_to_universal) in a folder next to it, verified like every checkpoint, and
loaded with DeepSpeed's `checkpoint.load_universal`.

  checkpoints/step-N/                      the original, never modified or deleted (nothing lost)
  checkpoints/universal/step-N/            its universal form, with its own MANIFEST.json
  checkpoints/universal/.staging-step-N/   a conversion in progress (a crash leaves at most this)

Rank 0 converts: the tool reads every rank's shards and has no per-rank mode. The other ranks wait
in a gloo group of their own whose timeout is WAIT, since the run's process-group timeout
(watchdog.pg_timeout_s) may be shorter than a large model's conversion. A universal folder that
verifies is reused (a second resize from the same step converts nothing); one whose original step
folder was pruned is removed by rank 0 at the next DeepSpeed load (`drop_orphans`).
"""

from __future__ import annotations

import argparse
import json
import shutil
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from hpctrain.kernel import checkpoint as fmt
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.files import fsync_path, utc_now
from train_entry.checkpoint.common import stderr
from train_entry.checkpoint.export import quiet

FOLDER = "universal"
WAIT = timedelta(hours=2)  # how long the other ranks wait for rank 0's conversion


def target(folder: Path) -> Path:
    """Where the universal form of the checkpoint `folder` (checkpoints/step-N) goes."""
    return folder.parent / FOLDER / folder.name


def manifest_of(folder: Path) -> dict[str, object]:
    """The manifest of a checkpoint the load already verified (train_entry/checkpoint/load.py)."""
    try:
        manifest = json.loads((folder / fmt.MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{folder}: cannot read {fmt.MANIFEST} ({exc})") from None
    return manifest if isinstance(manifest, dict) else {}


def saved_world(folder: Path) -> int | None:
    """The world size the checkpoint `folder` was saved with."""
    world = manifest_of(folder).get("world_size")
    return world if isinstance(world, int) else None


def needs(folder: Path, *, world: int) -> bool:
    """Whether `folder` must go through the universal form to load at `world` ranks: ZeRO's
    optimizer shards are per rank; stage 0 keeps the whole state in one file that loads anywhere."""
    saved = saved_world(folder)
    return saved is not None and saved != world and any(folder.glob("*optim_states.pt"))


def ensure(folder: Path) -> Path:
    """The verified universal form of `folder`, converted by rank 0 if it is not there yet (a
    collective: every rank calls it; a failure is a UserError on every rank)."""
    out = target(folder)
    slow = dist.new_group(backend="gloo", timeout=WAIT)
    try:
        why = [_convert_once(folder, out) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(why, src=0, group=slow)
    finally:
        dist.destroy_process_group(slow)
    if why[0] is not None:
        raise UserError(str(why[0]))
    return out


def _convert_once(folder: Path, out: Path) -> str | None:
    """Rank 0: convert unless a verified conversion is there; the error line, or None."""
    manifest, _ = fmt.verify(out)
    if manifest is not None and manifest.get("source") == _source(folder):
        stderr(f"{out}: the universal form of {folder.name} is there and verifies; reusing it")
        return None
    try:
        convert(folder, out)
    except UserError as exc:
        return str(exc)
    except Exception as exc:  # a full disk, say: it must reach the waiting ranks as an error
        return f"converting {folder} to DeepSpeed's universal form failed: {exc!r}"
    return None


def _source(folder: Path) -> str:
    """What identifies the original: its name and its manifest's digest (a re-saved step differs)."""
    return f"{folder.name} {fmt.sha256_file(folder / fmt.MANIFEST)}"


def convert(folder: Path, out: Path) -> None:
    """ds_to_universal from `folder` into `out`, committed like a save: a staging folder, the
    manifest (sizes and digests), then one rename. `folder` is only read."""
    # rank 0 reads every rank's files here: their digests too (a rank's load checks only its own)
    manifest, why = fmt.verify(folder)
    if manifest is None:
        raise UserError(f"{folder} does not verify ({why}); it cannot be converted")
    staging = out.parent / fmt.staging_name(fmt.step_of(out.name) or 0)
    shutil.rmtree(staging, ignore_errors=True)  # a conversion killed half way
    staging.parent.mkdir(parents=True, exist_ok=True)
    stderr(
        f"converting {folder} (saved by {manifest.get('world_size')} ranks) to DeepSpeed's "
        f"universal form in {out}"
    )
    with quiet(f"converting {folder} to DeepSpeed's universal checkpoint"):
        # lazy: deepspeed is an optional extra; only a resize of its checkpoint needs the tool
        from deepspeed.checkpoint import ds_to_universal

        args = argparse.Namespace(
            input_folder=str(folder),
            output_folder=str(staging),
            num_extract_workers=1,  # in-process: no pool forked from a rank that holds a group
            num_merge_workers=1,
            keep_temp_folder=False,
            strict=True,
            inject_missing_state=True,  # older engines saved no universal_checkpoint_info
        )
        ds_to_universal.main(args)
    (staging.parent / "latest_universal").unlink(missing_ok=True)  # the tool's; we name the tag
    fields = {
        "step": manifest["step"],
        "strategy": manifest.get("strategy"),
        "world_size": manifest.get("world_size"),
        "universal": True,
        "source": _source(folder),
        "torch": torch.__version__,
        "created": utc_now(),
    }
    fmt.write_manifest(staging, out, fields)
    fmt.latest_tmp(out.parent).unlink(missing_ok=True)  # write_manifest's; no `latest` here
    shutil.rmtree(out, ignore_errors=True)  # a stale conversion (its source was re-saved)
    staging.rename(out)
    fsync_path(out.parent)


def drop_orphans(ckpt_dir: Path) -> None:
    """Universal folders whose original was pruned: the original is the checkpoint, this a copy."""
    for step, folder in fmt.step_folders(ckpt_dir / FOLDER):
        if not (ckpt_dir / fmt.step_name(step)).exists():
            shutil.rmtree(folder, ignore_errors=True)
