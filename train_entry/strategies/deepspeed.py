"""DeepSpeed ZeRO 0-3 with optional CPU/NVMe offload; the engine owns optimizer, schedule and scaling.

The JSON is generated from our config (one source of truth), a user JSON (deepspeed.config_file) is
merged over it, and the result is validated with DeepSpeed's own DeepSpeedConfig before any process
group exists. On CPU: gloo, no C++ op builds (shm comm marked incompatible, torch AdamW as a client
optimizer, which also resumes bit-exactly unlike DeepSpeed's C++ Adams).
"""

from __future__ import annotations

import copy
import inspect
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol, cast

import torch
from torch import nn

from hpctrain.kernel.errors import UserError
from train_entry.checkpoint import universal
from train_entry.checkpoint.common import stderr
from train_entry.checkpoint.export import quiet
from train_entry.checkpoint.safeload import load_torch, private
from train_entry.config import TrainConfig
from train_entry.dist import pick_device
from train_entry.optim import build_optimizer, build_scheduler
from train_entry.strategies.base import Strategy, Weights

MISSING = "deepspeed is not installed: pip install 'hpctrain[deepspeed]'"


def import_deepspeed(device_type: str = "cpu") -> ModuleType:
    if device_type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:  # lazy: deepspeed is an optional extra (and picks its accelerator when imported)
        import deepspeed
        import deepspeed.comm
        import deepspeed.ops
    except ImportError:
        raise UserError(MISSING) from None
    # Marking the op incompatible (without probing every op) keeps DeepSpeed from compiling
    # deepspeed_shm_comm (~30 s) in init_distributed; we use plain torch collectives.
    ops = vars(deepspeed.ops).setdefault("__compatible_ops__", {})
    ops["deepspeed_shm_comm"] = False
    module: ModuleType = deepspeed  # untyped: ignore_missing_imports
    return module


def _merge(base: dict[str, object], over: dict[str, object]) -> dict[str, object]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        mine = out.get(k)
        out[k] = _merge(mine, v) if isinstance(v, dict) and isinstance(mine, dict) else v
    return out


def _offload(device: str, nvme_path: str | None) -> dict[str, object]:
    d: dict[str, object] = {"device": device}
    if device == "nvme":
        d["nvme_path"] = nvme_path
    return d


def build_config(cfg: TrainConfig, *, world: int, accum: int) -> dict[str, object]:
    t, d = cfg.train, cfg.deepspeed
    zero: dict[str, object] = {"stage": d.zero_stage}
    if d.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(d.offload_optimizer, d.nvme_path)
    if d.offload_param != "none":
        zero["offload_param"] = _offload(d.offload_param, d.nvme_path)
    conf: dict[str, object] = {
        "train_batch_size": t.global_batch,
        "train_micro_batch_size_per_gpu": t.micro_batch,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": t.clip_grad_norm or 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": t.precision == "bf16"},
        "fp16": {"enabled": t.precision == "fp16", "loss_scale": 0},  # 0: dynamic loss scaling
        # our client optimizer is torch's; DeepSpeed would otherwise insist on its C++ CPU Adam
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,  # we report progress ourselves
        "wall_clock_breakdown": False,
        "seed": t.seed,
    }
    if d.config_file:
        path = Path(d.config_file)
        try:
            user = json.loads(path.read_text())
        except OSError as e:
            raise UserError(f"deepspeed.config_file: cannot read {path} ({e.strerror})") from None
        except json.JSONDecodeError as e:
            raise UserError(
                f"{path}:{e.lineno}: not valid JSON ({e.msg}); fix deepspeed.config_file"
            ) from None
        for key in ("optimizer", "scheduler"):
            if key in user:
                raise UserError(
                    f"{path}: remove '{key}': it comes from our config (optim.*, schedule.*)"
                )
        conf = _merge(conf, user)
    return conf


def validate(cfg: TrainConfig, *, world: int, accum: int) -> dict[str, object]:
    """Build and validate the DeepSpeed JSON with DeepSpeed's own class; no process group is needed."""
    deepspeed = import_deepspeed(pick_device())
    # lazy: deepspeed is an optional extra (imported by import_deepspeed just above)
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.config import DeepSpeedConfig

    conf = build_config(cfg, world=world, accum=accum)
    src = cfg.deepspeed.config_file or "the generated DeepSpeed config"
    # Any: DeepSpeed objects or JSON config values (untyped)
    tb: Any  # JSON values (a user file may hold anything)
    mb: Any  # Any: DeepSpeed objects or JSON config values (untyped)
    ga: Any  # Any: DeepSpeed objects or JSON config values (untyped)
    tb, mb, ga = (
        conf.get(k)
        for k in (
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
        )
    )
    if tb != mb * ga * world:
        raise UserError(
            f"{src}: train_batch_size({tb}) != train_micro_batch_size_per_gpu({mb}) * "
            f"gradient_accumulation_steps({ga}) * world_size({world}) = {mb * ga * world}"
        )
    accel = get_accelerator()
    fp16: Any = conf.get("fp16", {})  # Any: JSON config values (a user file may hold anything)
    if fp16.get("enabled") and not accel.is_fp16_supported():
        raise UserError(
            f"train.precision=fp16: DeepSpeed has no fp16 on this device "
            f"({accel.device_name()}); use --train.precision=bf16 or fp32"
        )
    # Without DeepSpeed's process group DeepSpeedConfig assumes one rank: check per-rank arithmetic.
    probe = conf if deepspeed.comm.is_initialized() else dict(conf, train_batch_size=mb * ga)
    try:
        DeepSpeedConfig(probe)
    except Exception as e:  # DeepSpeed raises AssertionError/ValueError/pydantic errors
        msg = " ".join(str(e).split())
        raise UserError(f"{src}: DeepSpeed rejects the config: {msg[:400]}") from None
    del deepspeed
    return conf


class DeepSpeedStrategy(Strategy):
    """DeepSpeed ZeRO: the engine owns the optimizer, the schedule, loss scaling and its checkpoint."""

    name = "deepspeed"

    @classmethod
    def wrap(
        cls, model: nn.Module, *, cfg: TrainConfig, device: torch.device, grad_accum: int
    ) -> DeepSpeedStrategy:
        deepspeed = import_deepspeed(device.type)
        world = torch.distributed.get_world_size()
        conf = validate(cfg, world=world, accum=grad_accum)
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
        optimizer = build_optimizer(model.parameters(), cfg)
        engine, _, _, scheduler = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            config=conf,
            lr_scheduler=lambda opt: build_scheduler(opt, cfg),
        )
        return cls(
            engine,
            None,
            scheduler,
            device=engine.device,
            grad_accum=grad_accum,
            extra={"ds_config": conf},
        )

    @staticmethod
    def validate(cfg: TrainConfig, *, world: int, accum: int) -> None:
        validate(cfg, world=world, accum=accum)

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss)  # scales by 1/gradient_accumulation_steps itself
        if not self.model.is_gradient_accumulation_boundary():
            self.model.step()  # only advances DeepSpeed's micro-step counter

    def step(self) -> float:
        self.model.step()  # clip, optimizer, loss scale, LR schedule
        norm = self.model.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def lr(self) -> float:
        return float(self.model.get_lr()[0])

    @property
    def checkpointed_scheduler(self) -> None:
        return None  # DeepSpeed saves its scheduler inside its own checkpoint

    # ---- its checkpoint: the engine's own files (the checkpointer calls these, never DCP)
    @staticmethod
    def save_engine(model: nn.Module, *, folder: Path) -> None:
        cast(_Engine, model).save_checkpoint(
            str(folder.parent), tag=folder.name, client_state={}, save_latest=False
        )

    @staticmethod
    def load_engine(model: nn.Module, *, folder: Path) -> None:
        """Same world size: the engine's own files. Another one (ZeRO 1-3): their universal form,
        converted once next to them (train_entry/checkpoint/universal.py) and loaded with
        DeepSpeed's `checkpoint.load_universal`, switched on for this load only."""
        engine = cast(_Engine, model)
        world = torch.distributed.get_world_size()
        if torch.distributed.get_rank() == 0:
            universal.drop_orphans(folder.parent)  # conversions of checkpoints pruned since
        resize = universal.needs(folder, world=world)
        if resize:
            source, folder = folder, universal.ensure(folder)
            private(folder, source.parent.parent)  # its files unpickle fully too
            if torch.distributed.get_rank() == 0:
                stderr(f"loading {source.name} at {world} ranks from {folder}")
        config = engine._config
        before = config.load_universal_checkpoint
        config.load_universal_checkpoint = resize
        try:
            load_path, _ = engine.load_checkpoint(
                str(folder.parent),
                tag=folder.name,
                load_optimizer_states=True,
                load_lr_scheduler_states=True,
            )
        finally:
            config.load_universal_checkpoint = before
        if load_path is None:
            raise UserError(f"DeepSpeed could not load {folder}")

    @staticmethod
    def check_resume(folder: Path, *, saved_world: object, world: int) -> None:
        """Any world size loads: another one goes through the universal form (load_engine)."""

    @staticmethod
    def full_weights(folder: Path) -> Weights:
        """The fp32 weights of any ZeRO stage through DeepSpeed's own zero_to_fp32 (lazy where it
        can: the optimizer shards are read once, each tensor gathered when taken); stage 0 (no
        ZeRO optimizer files): the module state the engine saved."""
        run = folder.parent.parent  # RUN/checkpoints/step-N
        zero = any(folder.glob("*optim_states.pt"))
        if zero:  # zero_to_fp32 unpickles every file fully (they hold DeepSpeed's own classes)
            private(folder, run)
        with quiet(f"reading the DeepSpeed checkpoint {folder}"):
            import_deepspeed()
            if not zero:  # the engine's module state: weights-only loads it
                states = load_torch(folder / "mp_rank_00_model_states.pt", root=run)
                module = cast(dict[str, dict[str, object]], states)["module"]  # {name: tensor}
                sd = {k: v for k, v in module.items() if isinstance(v, torch.Tensor)}
            else:
                # lazy: deepspeed is an optional extra (imported by import_deepspeed just above)
                from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

                lazy = (
                    "lazy_mode"
                    in inspect.signature(get_fp32_state_dict_from_zero_checkpoint).parameters
                )
                sd = get_fp32_state_dict_from_zero_checkpoint(
                    str(folder.parent), tag=folder.name, **({"lazy_mode": True} if lazy else {})
                )

        def take(names: list[str]) -> dict[str, torch.Tensor]:
            with quiet(f"reading the DeepSpeed checkpoint {folder}"):
                return {n: torch.as_tensor(sd[n].contiguous()) for n in names}

        return Weights({k: (tuple(v.shape), v.dtype) for k, v in sd.items()}, take)


class _Config(Protocol):
    load_universal_checkpoint: bool  # read by every load_checkpoint (DeepSpeed 0.17-0.19)


class _Engine(Protocol):
    """What the checkpoint uses of DeepSpeed's engine (deepspeed ships no type information)."""

    _config: _Config

    def save_checkpoint(
        self, save_dir: str, *, tag: str, client_state: dict[str, object], save_latest: bool
    ) -> object: ...

    def load_checkpoint(
        self,
        load_dir: str,
        *,
        tag: str,
        load_optimizer_states: bool,
        load_lr_scheduler_states: bool,
    ) -> tuple[str | None, object]: ...


STRATEGY = DeepSpeedStrategy
