"""Loading a TrainConfig: the YAML file (with the line of every key), dotted overrides, every
problem at once (file:line: key: fix), cross-field checks, and the batch arithmetic."""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import yaml
from pydantic import ValidationError as PydanticError

from hpctrain.kernel import hffolder, jobenv, mesh, strategies
from hpctrain.kernel.errors import Problem, UserError, ValidationError
from hpctrain.kernel.yamlsafe import read_yaml
from train_entry.config.models import TrainConfig, all_keys

HF_COLLATE = "train_entry.pretrained.data:collate"  # its COLLATE (that module imports torch)

# ---------------------------------------------------------------- loading


class _Origins(dict[str, tuple[str, int | None]]):
    """dotted key -> (file, line) or ("flag", None)."""


def _load_yaml(path: Path) -> tuple[dict[str, object], _Origins]:
    """The safe YAML reader the profiles use (hpctrain.kernel.yamlsafe: no tags, anchors or merge
    keys, size and depth caps, every problem as file:line: key), with no cache: training ranks
    write nothing. The line of every mapping key goes into the origins (1-based)."""
    if not path.is_file():
        try:
            path.read_text()
        except OSError as e:
            raise UserError(
                f"{path}: cannot read the config file ({e.strerror}); check --config"
            ) from None
    problems: list[Problem] = []
    doc = read_yaml(
        path, problems, empty_ok=True, top_fix="the config is a mapping of sections (e.g. 'train:')"
    )
    if problems or doc is None:
        raise ValidationError(problems)
    origins = _Origins()
    for keys, line in doc.lines.items():
        if all(isinstance(k, str) for k in keys):
            origins[".".join(str(k) for k in keys)] = (str(path), line)
    return dict(doc.data), origins


def _parse_value(text: str) -> object:
    # YAML scalars: 3e-4 -> float, true -> bool, null -> None, [0.9, 0.99] -> list.
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def _suggest(key: str) -> str:
    sections = [k for k, f in TrainConfig.model_fields.items() if f.default_factory is not None]
    close = difflib.get_close_matches(key, [*all_keys(), *sections], n=1, cutoff=0.6)
    if not close:
        last = key.rsplit(".", 1)[-1]
        close = [k for k in all_keys() if k.rsplit(".", 1)[-1] == last][:1]
    return f"did you mean '{close[0]}'?" if close else "remove it (see --help for every key)"


def apply_overrides(
    data: dict[str, object], overrides: list[str], origins: _Origins
) -> list[Problem]:
    problems: list[Problem] = []
    items = list(overrides)
    while items:
        item = items.pop(0)
        if item.startswith("--") and "=" not in item and items and not items[0].startswith("--"):
            item = f"{item}={items.pop(0)}"  # `--optim.lr 3e-4` works like `--optim.lr=3e-4`
        if not item.startswith("--") or "=" not in item:
            problems.append(
                Problem(
                    f"'{item}' is not an option; overrides look like --optim.lr=3e-4",
                    file="command line",
                )
            )
            continue
        key, _, raw = item[2:].partition("=")
        key = key.replace("-", "_")
        parts = key.split(".")
        node = data
        for p in parts[:-1]:
            child = node.get(p)
            if not isinstance(child, dict):
                child = node[p] = {}
            node = child
        node[parts[-1]] = _parse_value(raw)
        origins[key] = ("flag", None)
    return problems


def _problems_from(err: PydanticError, origins: _Origins) -> list[Problem]:
    problems = []
    for e in err.errors():
        loc = [str(x) for x in e["loc"]]
        # tuple fields report the index as a last element ("optim.betas.0"): point at the key
        while loc and loc[-1].isdigit():
            loc.pop()
        key = ".".join(loc)
        file, line = origins.get(key, (None, None))
        if e["type"] == "extra_forbidden":
            msg = f"unknown key; {_suggest(key)}"
        else:
            msg = e["msg"]
            if "input" in e and not isinstance(e["input"], dict):
                msg += f" (got {e['input']!r})"
            if e["type"] == "literal_error":
                msg += "; use one of the listed values"
        if file is None:
            file = "<defaults>" if key not in origins else None
        problems.append(
            Problem(
                msg,
                file=file if file != "flag" else f"--{key}",
                line=line,
                key=None if file == "flag" else key,
            )
        )
    return problems


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    flags: Mapping[str, object] | None = None,
    *,
    world: int | None = None,
    gpus_per_node: int | None = None,
) -> TrainConfig:
    """Defaults < YAML file < named flags ({"train.max_steps": 60}) < dotted overrides. With
    `world`, the parallel layout's problems (check_layout) come first in the same error, so a
    layout that cannot work is named beside (and before) what it asks of the model."""
    data, origins = _load_yaml(Path(path)) if path else ({}, _Origins())
    named = [f"--{k}={v}" for k, v in (flags or {}).items() if v is not None]
    problems = apply_overrides(data, [*named, *overrides], origins)
    try:
        cfg = TrainConfig.model_validate(data)
    except PydanticError as e:
        problems += _problems_from(e, origins)
        raise ValidationError(problems) from None
    if problems:
        raise ValidationError(problems)
    if "strategy" not in cfg.model_fields_set and (cfg.parallel.tp > 1 or cfg.parallel.pp > 1):
        # a layout with the strategy left at its default: the mesh's data-parallel dimension
        # (ddp does not compose with tp/pp); an explicit ddp stays an error with its fix
        cfg.strategy = strategies.MESH
    problems = _cross_checks(cfg, origins)
    if world is not None:
        try:
            check_layout(cfg, world, gpus_per_node)
        except ValidationError as e:
            problems = [*e.problems, *problems]
    if problems:
        raise ValidationError(problems)
    return cfg


def _cross_checks(cfg: TrainConfig, origins: _Origins) -> list[Problem]:
    def at(key: str, msg: str) -> Problem:
        file, line = origins.get(key, ("<defaults>", None))
        return Problem(
            msg,
            file=f"--{key}" if file == "flag" else file,
            line=line,
            key=None if file == "flag" else key,
        )

    out = []
    if cfg.model.factory is None and cfg.model.d_model % cfg.model.n_heads:
        out.append(
            at(
                "model.n_heads",
                f"n_heads={cfg.model.n_heads} does not divide "
                f"d_model={cfg.model.d_model}; pick a divisor",
            )
        )
    if hffolder.folder_of(cfg.model.factory) and cfg.data.factory is None and not cfg.data.collate:
        # the demo task in transformers' keys (input_ids, labels): model(**batch) gives its loss
        cfg.data.collate = HF_COLLATE
    for check in _SECTION_CHECKS.get(cfg.strategy, ()):
        out += check(cfg, at)
    return out + _parallel_checks(cfg, at)


def _parallel_checks(cfg: TrainConfig, at: Callable[[str, str], Problem]) -> list[Problem]:
    """What tp/pp need from the model: the demo GPT's sizes, or the user's plan and split."""
    par, m, out = cfg.parallel, cfg.model, []
    if (par.tp > 1 or par.pp > 1) and cfg.train.precision == "fp16":
        out.append(
            at(
                "train.precision",
                "fp16 needs a loss scaler, which tp/pp runs do not have; use "
                "--train.precision=bf16 (or fp32)",
            )
        )
    if hffolder.folder_of(m.factory) is not None:
        return out + _pretrained_checks(cfg, at)
    if m.factory is not None:
        example = "see examples/gpt_parallel.py (the demo GPT's, worked through)"
        if par.tp > 1 and not par.tp_plan:
            out.append(
                at(
                    "parallel.tp_plan",
                    f"parallel.tp={par.tp} with your model ({m.factory}) needs its tensor-parallel "
                    "plan: set parallel.tp_plan to 'pkg.module:fn', fn(model, tp_mesh, config) "
                    f"applying parallelize_module; {example}",
                )
            )
        if par.pp > 1 and not par.pp_split:
            out.append(
                at(
                    "parallel.pp_split",
                    f"parallel.pp={par.pp} with your model ({m.factory}) needs its pipeline split: "
                    "set parallel.pp_split to 'pkg.module:fn', fn(model, stage_ids, n_stages, "
                    f"config) -> (stage modules, loss_fn); {example}",
                )
            )
        return out
    if par.tp > 1:  # the demo GPT's plan: heads, the sequence (sequence parallel), the vocabulary
        for key, size in (
            ("n_heads", m.n_heads),
            ("seq_len", m.seq_len),
            ("vocab_size", m.vocab_size),
        ):
            if size % par.tp:
                out.append(
                    at(
                        f"model.{key}",
                        f"parallel.tp={par.tp} does not divide model.{key}({size}): the demo "
                        f"GPT's TP plan splits it over the tp ranks; set model.{key} to a "
                        f"multiple of {par.tp}",
                    )
                )
    return out


def _pretrained_checks(cfg: TrainConfig, at: Callable[[str, str], Problem]) -> list[Problem]:
    """An hf:<folder> model, read without torch (hpctrain/kernel/hffolder.py): its files against
    its config.json, and what tp/pp need of it. The TP plan itself (transformers' class) is checked
    by `train_entry --check` (train_entry/pretrained/build.py), which imports torch."""
    path = hffolder.folder_of(cfg.model.factory)
    assert path is not None
    try:
        folder = hffolder.read(path)
    except UserError as e:
        return [at("model.factory", str(e))]
    found = hffolder.problems(folder, tp=cfg.parallel.tp, pp=cfg.parallel.pp)
    return [at("model.factory", line) for line in found]


def _deepspeed_checks(cfg: TrainConfig, at: Callable[[str, str], Problem]) -> list[Problem]:
    ds, out = cfg.deepspeed, []
    if "nvme" in (ds.offload_optimizer, ds.offload_param) and not ds.nvme_path:
        out.append(
            at("deepspeed.nvme_path", "NVMe offload needs a folder; set deepspeed.nvme_path")
        )
    if ds.offload_param != "none" and ds.zero_stage != 3:
        out.append(
            at(
                "deepspeed.offload_param",
                f"parameter offload needs zero_stage 3 (got "
                f"{ds.zero_stage}); set deepspeed.zero_stage=3 or offload_param=none",
            )
        )
    return out


# The strategy's own section, checked only when that strategy runs (keyed by strategy name).
_SECTION_CHECKS: dict[
    str, tuple[Callable[[TrainConfig, Callable[[str, str], Problem]], list[Problem]], ...]
] = {
    "deepspeed": (_deepspeed_checks,),
}


# ---------------------------------------------------------------- sizes, checked before any work


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_layout(cfg: TrainConfig, world: int, gpus_per_node: int | None = None) -> mesh.Layout:
    """The parallel layout at this world size (kernel/mesh.check_layout: every problem at once)."""
    par = cfg.parallel
    problems = mesh.check_layout(
        world=world,
        tp=par.tp,
        pp=par.pp,
        gpus_per_node=gpus_per_node,
        n_layers=_layers(cfg),
        schedule=par.schedule,
        microbatches=par.microbatches,
        strategy=cfg.strategy,
    )
    if problems:
        for p in problems:
            p.file = f"--{p.key}" if p.key else None
            p.key = None
        raise ValidationError(problems)
    return mesh.Layout.of(world, par.tp, par.pp)


def _layers(cfg: TrainConfig) -> int | None:
    """The layers a pipeline splits: the demo GPT's, an hf: folder's config.json's; else unknown."""
    if cfg.model.factory is None:
        return cfg.model.n_layers
    path = hffolder.folder_of(cfg.model.factory)
    try:
        return hffolder.read(path).int("num_hidden_layers") if path else None
    except UserError:
        return None  # said by the cross-checks


def check_sizes(
    cfg: TrainConfig, world: int | None = None, gpus_per_node: int | None = None
) -> int:
    """Check the topology, the parallel layout and the batch arithmetic; return the gradient
    accumulation steps. The batch is per data-parallel rank: tp and pp ranks share theirs."""
    world = world_size() if world is None else world
    nnodes, gpn = jobenv.get(jobenv.NNODES), jobenv.get(jobenv.GPUS_PER_NODE)
    if gpus_per_node is None and gpn and int(gpn) > 0:
        gpus_per_node = int(gpn)
    if nnodes and gpn and int(gpn) > 0 and int(nnodes) * int(gpn) != world:
        raise UserError(
            f"WORLD_SIZE({world}) != {jobenv.NNODES}({nnodes}) * {jobenv.GPUS_PER_NODE}"
            f"({gpn}) = {int(nnodes) * int(gpn)}; launch torchrun with --nnodes {nnodes} "
            f"--nproc-per-node {gpn}"
        )
    layout = check_layout(cfg, world, gpus_per_node)
    dp = layout.dp
    ranks = f"world_size({world})" if dp == world else f"dp({dp}) (world_size({world}) / (tp x pp))"
    t = cfg.train
    if not {"global_batch", "micro_batch", "grad_accum"} & t.model_fields_set and t.global_batch % (
        dp * t.micro_batch
    ):
        # Nothing set by the user: the defaults adapt to the world size (the same global batch,
        # fewer samples per rank; else one default micro-batch per rank). 1 and 2 ranks keep 16 = 2 x 8.
        if t.global_batch % dp == 0:
            t.micro_batch = t.global_batch // dp
        else:
            t.global_batch = dp * t.micro_batch
    per_step = dp * t.micro_batch
    if t.grad_accum is None:
        if t.global_batch % per_step:
            raise UserError(
                f"train.global_batch({t.global_batch}) is not divisible by "
                f"{ranks} * train.micro_batch({t.micro_batch}) = {per_step}; "
                f"set train.global_batch to a multiple of {per_step}"
            )
        accum = t.global_batch // per_step
        _check_microbatches(cfg)
        return accum
    if dp * t.micro_batch * t.grad_accum != t.global_batch:
        raise UserError(
            f"train.global_batch({t.global_batch}) != {ranks} * "
            f"train.micro_batch({t.micro_batch}) * train.grad_accum({t.grad_accum}) = "
            f"{per_step * t.grad_accum}; set train.global_batch={per_step * t.grad_accum} "
            f"or leave train.grad_accum unset to derive it"
        )
    _check_microbatches(cfg)
    return t.grad_accum


def _check_microbatches(cfg: TrainConfig) -> None:
    """The pipeline cuts each micro-batch into microbatches: checked once the batch is resolved."""
    par = cfg.parallel
    if par.pp > 1:
        problems = mesh.check_layout(
            world=par.pp,
            pp=par.pp,
            schedule=par.schedule,
            microbatches=par.microbatches,
            micro_batch=cfg.train.micro_batch,
        )
        if problems:
            raise ValidationError([Problem(p.message, file=f"--{p.key}") for p in problems])
