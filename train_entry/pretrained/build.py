"""The model of an `hf:<folder>` spec, on the meta device: config.json -> AutoModelForCausalLM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpctrain.kernel import hffolder
from hpctrain.kernel.errors import UserError
from train_entry.config import TrainConfig

MARK = "_hpctrain_pretrained"  # the folder, set on a model built here (build.folder_of)


def transformers_or_exit() -> Any:  # Any: transformers is an optional extra without stubs
    try:
        import transformers  # lazy: an optional extra, only for hf: models
    except ImportError:
        raise UserError("--model hf:... needs transformers: pip install 'hpctrain[hf]'") from None
    return transformers


def check(cfg: TrainConfig) -> hffolder.Folder:
    """Everything checkable before any process group: the folder's files against its config, and
    the architecture's tensor-parallel plan when tp > 1 (UserError, one line per problem)."""
    path = hffolder.folder_of(cfg.model.factory)
    assert path is not None, "check() is for hf: models"
    folder = hffolder.read(path)
    found = hffolder.problems(folder, tp=cfg.parallel.tp, pp=cfg.parallel.pp)
    hf = transformers_or_exit()
    try:
        config = hf.AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"{path / hffolder.CONFIG}: transformers cannot read it ({e})") from None
    if cfg.parallel.tp > 1 and not cfg.parallel.tp_plan:  # your own plan wins
        from train_entry.pretrained.layout import tp_styles  # lazy: torch's tensor parallel

        try:
            tp_styles(config, path)
        except UserError as e:
            found.append(str(e))
    if found:
        raise UserError("\n".join(found))
    return folder


def meta_model(config: TrainConfig) -> nn.Module:
    """The transformers model with every parameter and buffer on the meta device (no memory), in
    float32 (the master weights; load.py casts each slice as it reads it). The factory of
    `--model hf:<folder>` (train_entry/model.py load_object)."""
    folder = check(config)
    hf = transformers_or_exit()
    arch = hf.AutoConfig.from_pretrained(str(folder.path))
    with torch.device("meta"):
        model = hf.AutoModelForCausalLM.from_config(arch, dtype=torch.float32)
    if not isinstance(model, nn.Module):
        raise UserError(f"{folder.path}: AutoModelForCausalLM gave {type(model).__name__}")
    setattr(model, MARK, folder.path)
    return model


def folder_of(model: nn.Module) -> Path | None:
    """The folder a model was built from here; None for any other model."""
    path = getattr(model, MARK, None)
    return path if isinstance(path, Path) else None
