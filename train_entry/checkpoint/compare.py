"""Comparing two checkpoints part by part (`hpctrain check-resume`, `python -m
train_entry.checkpoint compare A B`)."""

from __future__ import annotations

from pathlib import Path

import torch

from hpctrain.kernel.checkpoint import TRAIN_STATE, check_manifest, rng_blob, rng_ranks
from hpctrain.kernel.errors import UserError
from train_entry import state as st
from train_entry.checkpoint.safeload import load_torch
from train_entry.checkpoint.writer import load_plain


def _load_weights(folder: Path) -> dict[str, object]:
    """{"model": ..., "optimizer": ...} of a DCP or DeepSpeed checkpoint, on CPU, no process group."""
    if (folder / ".metadata").exists():
        app = load_plain(folder)["app"]
        assert isinstance(app, dict)  # the checkpointer saves {"app": {"model", "optim"}}
        return {"model": app.get("model"), "optimizer": app.get("optim")}
    model: dict[str, object] = {}
    optimizer: dict[str, object] = {}
    for path in sorted(folder.glob("*.pt")):
        # DeepSpeed's optimizer files hold its loss scaler: loaded fully only when private
        obj = load_torch(path, root=folder.parent.parent)
        if "optim" in path.name:
            optimizer[path.name] = _get(obj, "optimizer_state_dict")
        else:
            model[path.name] = _get(obj, "module")
    return {"model": model, "optimizer": optimizer}


def _get(obj: object, key: str) -> object:
    """obj[key] of a dict that has it, else obj itself."""
    return obj.get(key, obj) if isinstance(obj, dict) else obj


def _same(a: object, b: object) -> bool:
    """Bit-exact equality of nested containers of tensors and plain values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(
                a.detach().cpu().contiguous().reshape(-1).view(torch.uint8),
                b.detach().cpu().contiguous().reshape(-1).view(torch.uint8),
            )
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    if type(a) is type(b) and hasattr(a, "__dict__") and type(a).__eq__ is object.__eq__:
        return _same(vars(a), vars(b))  # e.g. DeepSpeed's loss scaler object
    return bool(a == b)


def compare(a: Path, b: Path) -> dict[str, list[str]]:
    """Which parts of two checkpoints of the same step differ: model, optimizer, rng (rank R),
    data, loop, scheduler, scaler. Used by `hpctrain check-resume`."""
    differs: list[str] = []
    wa, wb = _load_weights(a), _load_weights(b)
    for part in ("model", "optimizer"):
        if not _same(wa[part], wb[part]):
            differs.append(part)
    ma, mb = _manifest(a), _manifest(b)
    for rank in sorted(set(rng_ranks(ma)) | set(rng_ranks(mb))):
        ra, rb = _rng(a, ma, rank), _rng(b, mb, rank)
        if ra is None or rb is None or ra != rb:
            differs.append(f"rng (rank-{rank:05d})")
    la, lb = (st.loads((x / TRAIN_STATE).read_text()) for x in (a, b))
    for key, label in (("data", "data"), ("scheduler", "scheduler"), ("scaler", "scaler")):
        if not _same(la.get(key), lb.get(key)):
            differs.append(label)
    if any(la.get(k) != lb.get(k) for k in ("step", "epoch", "micro_step")):
        differs.append("loop (step/epoch/micro_step)")
    return {"differs": differs}


def _manifest(folder: Path) -> dict[str, object]:
    manifest, why = check_manifest(folder)
    if manifest is None:
        raise UserError(f"{folder}: {why}")
    return manifest


def _rng(folder: Path, manifest: dict[str, object], rank: int) -> bytes | None:
    """A rank's saved generators (either layout: kernel/checkpoint.rng_blob), None if absent or
    damaged."""
    try:
        return rng_blob(folder, manifest, rank)
    except ValueError:
        return None
