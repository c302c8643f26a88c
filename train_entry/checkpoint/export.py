"""`hpctrain export`: a checkpoint's consolidated model weights as files the ecosystem loads.

What a checkpoint holds depends on who wrote it; each source gives the same thing, `Weights`: every
tensor's name, shape and dtype up front, and the full tensors of a few names on demand, so an
export holds one output shard in memory at a time, never the whole model:
  - DCP (DDP, FSDP2, and any mesh layout: DCP's metadata has each tensor's global shape and chunks):
    reader.load_full, the "app.model." entries;
  - an engine checkpoint (DeepSpeed ZeRO 0-3): the strategy's own `full_weights` (strategies/);
  - a runtime-API checkpoint (hpctrain.runtime, state.pt): the tensors under "model".
The files (names as Hugging Face writes them, so `from_pretrained` and other loaders find them):
  model.safetensors | pytorch_model.bin                            one file, or above --max-shard-size
  model-00001-of-0000N.safetensors ... + model.safetensors.index.json          (or the .bin ones)
  config.json [+ generation_config.json]                 when the model is a transformers model
They are written into a hidden folder beside the target and renamed into place at the end: an
export that fails leaves nothing, and an existing path is never written into.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import stat
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol, cast

import torch
from safetensors.torch import save_file
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.errors import UserError
from train_entry.checkpoint.reader import RawReader, load_full
from train_entry.checkpoint.safeload import load_torch
from train_entry.config import TrainConfig
from train_entry.model import call_factory, load_object
from train_entry.strategies import strategy_class
from train_entry.strategies.base import Weights

# format -> (single file, index file, shard file pattern), Hugging Face's names
FILES = {
    "safetensors": (
        "model.safetensors",
        "model.safetensors.index.json",
        "model-{i:05d}-of-{n:05d}.safetensors",
    ),
    "torch": (
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
        "pytorch_model-{i:05d}-of-{n:05d}.bin",
    ),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DCP_MODEL = (
    "app.model."  # the checkpointer saves {"app": {"model": ..., "optim": ...}} (common.AppState)
)
SCRIPT_STATE = "state.pt"  # hpctrain.runtime.STATE_FILE (that module imports no torch until used)


def dcp_weights(folder: Path) -> Weights:
    md = RawReader(str(folder)).read_metadata()
    specs, skipped = {}, []
    for key, meta in md.state_dict_metadata.items():
        if not key.startswith(DCP_MODEL):
            continue
        name = key.removeprefix(DCP_MODEL)
        if isinstance(meta, BytesStorageMetadata):
            skipped.append(name)
        else:
            specs[name] = (tuple(meta.size), meta.properties.dtype)
    if not specs:
        raise UserError(f"{folder}: no model weights in it ({DCP_MODEL}* in its .metadata)")
    return Weights(
        specs,
        lambda names: load_full(folder, DCP_MODEL, [DCP_MODEL + n for n in names]),
        skipped,
    )


def script_weights(folder: Path) -> Weights:
    # Written by hpctrain.runtime (torch.save of the user's state), read weights-only: one that
    # holds more than tensors and plain data is refused, whoever wrote it.
    state = load_torch(folder / SCRIPT_STATE)
    model = state.get("model") if isinstance(state, dict) else None
    if not isinstance(model, dict):
        model = {}
    tensors = {k: v for k, v in model.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        keys = ", ".join(map(str, state)) if isinstance(state, dict) else type(state).__name__
        raise UserError(
            f"{folder / SCRIPT_STATE}: no model weights under 'model' (it holds: {keys[:200]}); "
            "export reads a runtime checkpoint saved as "
            "ckpt.save(step, {'model': model.state_dict(), ...})"
        )
    skipped = [k for k in model if k not in tensors]
    return Weights(
        {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()},
        lambda names: {n: tensors[n] for n in names},
        skipped,
    )


def weights(folder: Path, manifest: Mapping[str, object]) -> Weights:
    """The source that wrote `folder`: its strategy's own reader, else DCP's or the runtime's."""
    name = manifest.get("strategy")
    if isinstance(name, str) and strategy_names.engine_checkpoint(name):
        got: Weights | None = strategy_class(name).full_weights(folder)
        if got is not None:
            return got
    files = manifest.get("files") or {}
    if not isinstance(files, dict):  # verify() read it as a mapping
        files = {}
    if ".metadata" in files:
        return dcp_weights(folder)
    if SCRIPT_STATE in files:
        return script_weights(folder)
    raise UserError(
        f"{folder}: no model weights hpctrain can read (strategy {name!r}, no .metadata or "
        f"{SCRIPT_STATE}); export reads DDP, FSDP, DeepSpeed and runtime-API checkpoints"
    )


# ------------------------------------------------------------------ writing
def plan_shards(sizes: dict[str, int], limit: int) -> list[list[str]]:
    """Names in order, cut into shards of at most `limit` bytes (a larger tensor: its own)."""
    shards: list[list[str]] = []
    cur: list[str] = []
    size = 0
    for name, nbytes in sizes.items():
        if cur and size + nbytes > limit:
            shards.append(cur)
            cur, size = [], 0
        cur.append(name)
        size += nbytes
    if cur:
        shards.append(cur)
    return shards


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * torch.empty((), dtype=dtype).element_size()


def _ready(tensors: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Cast floating tensors to `dtype`; own storage for each (torch.save would otherwise write a
    view's whole storage, and safetensors refuses tensors that share memory)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in tensors.items():
        t = t.detach().cpu()
        if dtype is not None and t.is_floating_point() and t.dtype != dtype:
            t = t.to(dtype)
        shared = t.untyped_storage().data_ptr() in seen
        whole = t.untyped_storage().nbytes() == t.numel() * t.element_size()
        if shared or not whole or not t.is_contiguous():
            t = t.contiguous().clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


def _save(tensors: dict[str, torch.Tensor], path: Path, fmt: str, meta: dict[str, str]) -> None:
    if fmt == "safetensors":
        save_file(tensors, str(path), metadata=meta)
    else:
        torch.save(tensors, path)
    with open(path, "rb") as f:  # durable before the folder is renamed into place
        os.fsync(f.fileno())


class _Saves(Protocol):
    def save_pretrained(self, folder: Path) -> object: ...


class Pretrained(Protocol):
    """What export uses of a transformers PreTrainedModel (transformers is an optional extra)."""

    config: _Saves

    def can_generate(self) -> bool: ...


def hf_model(config: Mapping[str, object] | None, world: int) -> Pretrained | None:
    """The user's model as a transformers PreTrainedModel (built on the meta device: no memory),
    or None when it is not one (or transformers is not installed)."""
    section = (config or {}).get("model")
    factory = section.get("factory") if isinstance(section, dict) else None
    if not factory or importlib.util.find_spec("transformers") is None:
        return None
    if "" not in sys.path and os.getcwd() not in sys.path:  # as `python -m` would find it
        sys.path.insert(0, os.getcwd())
    try:
        cfg = TrainConfig.model_validate(config)
        with torch.device("meta"):
            model = call_factory(
                load_object(factory, "model.factory"), config=cfg, rank=0, world_size=world
            )
    except Exception as exc:  # noqa: BLE001 - the weights are right either way: say it, go on
        print(
            f"warning: could not build model.factory {factory!r} to see whether it is a "
            f"transformers model ({str(exc).splitlines()[0][:200] if str(exc) else exc!r}); "
            "writing plain weights without config.json",
            file=sys.stderr,
        )
        return None
    from transformers import PreTrainedModel  # lazy: an optional extra, checked above

    return cast(Pretrained, model) if isinstance(model, PreTrainedModel) else None


def tied(hf: Pretrained | None) -> dict[str, str]:
    """name -> the name whose tensor it is, in a tied model (lm_head.weight under
    tie_word_embeddings)."""
    keys = getattr(hf, "_tied_weights_keys", None)
    if not isinstance(keys, dict) or not getattr(
        getattr(hf, "config", None), "tie_word_embeddings", 0
    ):
        return {}
    return {str(k): str(v) for k, v in keys.items()}


def export(
    folder: Path,
    manifest: Mapping[str, object],
    out: Path,
    *,
    fmt: str,
    dtype: str | None,
    max_shard: int,
    config: Mapping[str, object] | None,
    mask: int | None = None,
) -> dict[str, object]:
    """Write the weights of the checkpoint `folder` into the new folder `out` (see the module
    docstring); the summary: files, index, tensors, bytes, huggingface, skipped. Every file and
    folder it makes gets one mode (_modes): 0666 / 0777 less `mask` (the run folder's, from its
    storage.share, when `out` lies in it), else less this process's umask; never world-writable."""
    mask = _mask(mask)
    with quiet(f"reading the checkpoint {folder}"):
        src = weights(folder, manifest)
    world = manifest.get("world_size")
    hf = hf_model(config, world if isinstance(world, int) and world else 1)
    for name, same in tied(hf).items():  # written once, as transformers writes it
        if same in src.specs:
            src.specs.pop(name, None)
    cast = DTYPES[dtype] if dtype else None
    sizes = {
        n: _nbytes(shape, cast if cast is not None and dt.is_floating_point else dt)
        for n, (shape, dt) in src.specs.items()
    }
    shards = plan_shards(sizes, max_shard)
    single, index_name, pattern = FILES[fmt]
    names = (
        [single]
        if len(shards) == 1
        else [pattern.format(i=i + 1, n=len(shards)) for i in range(len(shards))]
    )
    meta = {"format": "pt"}  # what transformers checks in a safetensors header
    staging = _staging(out, mask)
    try:
        weight_map: dict[str, str] = {}
        for shard, fname in zip(shards, names, strict=True):
            with quiet(f"reading the checkpoint {folder}"):
                taken = src.take(shard)
            tensors = _ready(taken, cast)
            _save(tensors, staging / fname, fmt, meta)
            weight_map.update(dict.fromkeys(shard, fname))
            del tensors
        if len(shards) > 1:
            index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
            (staging / index_name).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        if hf is not None:
            hf.config.save_pretrained(staging)
            gen = getattr(hf, "generation_config", None)
            if gen is not None and hf.can_generate():
                with contextlib.suppress(Exception):  # an unusual one is not worth failing for
                    gen.save_pretrained(staging)
        for path in staging.iterdir():  # safetensors writes 0600, torch.save and json 0666 - umask
            _one_mode(path, mask)
        fd = os.open(staging, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if out.exists() or out.is_symlink():  # appeared meanwhile: never written into
            raise UserError(f"{out} exists now (it did not when the export started); not touched")
        os.rename(staging, out)
    except OSError as exc:  # a full disk, a quota: said in one line, nothing left behind
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(
            f"writing the export {out} failed: {exc.strerror or exc} "
            f"({exc.filename or staging}); nothing was left there"
        ) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return {
        "files": sorted(p.name for p in out.iterdir()),
        "index": index_name if len(shards) > 1 else None,
        "tensors": len(src.specs),
        "bytes": sum(sizes.values()),
        "huggingface": hf is not None,
        "skipped": src.skipped,
    }


def _mask(given: int | None) -> int:
    """The export's one rule for modes: `given` (a run folder's umask), else this process's
    umask; either way no write access for every account."""
    if given is None:
        given = os.umask(0o022)  # reading the umask sets it: put it back at once
        os.umask(given)
    return given | 0o002


def _one_mode(path: Path, mask: int) -> None:
    """A file 0666 & ~mask, a folder 0777 & ~mask (setgid kept); a symlink is left alone."""
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        return
    want = (0o777 if stat.S_ISDIR(mode) else 0o666) & ~mask
    if stat.S_IMODE(mode) & 0o777 != want:
        os.chmod(path, want | (stat.S_IMODE(mode) & stat.S_ISGID))


def _staging(out: Path, mask: int) -> Path:
    """The hidden folder beside `out` the files are written into, and any missing folder above
    it; each with the export's mode (_one_mode)."""
    name = f".{out.name}.partial-{os.getpid()}"
    if len(os.fsencode(name)) > 255:  # a long --out: the staging name must fit the same folder
        name = f".hpctrain-export.partial-{os.getpid()}"
    try:
        missing = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
        for path in [*reversed(missing), out.parent / name]:
            path.mkdir()
            _one_mode(path, mask)
    except OSError as exc:
        raise UserError(
            f"--out {out}: cannot create {exc.filename or out.parent} ({exc.strerror or exc}); "
            "give an --out in a folder you can write"
        ) from None
    return out.parent / name


@contextlib.contextmanager
def quiet(what: str) -> Iterator[None]:
    """Library chatter (prints, progress bars) captured; shown only with an error from inside."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            yield
    except UserError:
        raise
    except Exception as exc:
        tail = " | ".join(buf.getvalue().strip().splitlines()[-3:])
        raise UserError(
            f"{what} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            + (f" (it said: {tail[-300:]})" if tail else "")
        ) from None
