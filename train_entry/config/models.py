"""The TrainConfig models: every knob of the trainer, a docstring per field, and the key catalogue."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, TypedDict, TypeVar, Unpack

import yaml
from pydantic import BaseModel, ConfigDict, Field

from hpctrain.kernel import mesh
from hpctrain.kernel import snapshot as snapshot_store
from hpctrain.kernel import strategies as strategy_names

STRATEGIES = strategy_names.NAMES


class _Section(BaseModel):
    # A typo must be an error, never a silently ignored key (the Accelerate `fsdp_config: dict` pain).
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


T = TypeVar("T")


class _Bounds(TypedDict, total=False):
    ge: float
    gt: float
    le: float
    lt: float


def _f(default: T, description: str, **bounds: Unpack[_Bounds]) -> T:
    """A field with its default, its description (the --help text) and its numeric bounds."""
    field: T = Field(default, description=description, **bounds)
    return field


class ModelConfig(_Section):
    factory: str | None = _f(
        None,
        "Your model: 'pkg.module:factory' returning an nn.Module whose "
        "forward(batch) returns the loss (see train_entry/model.py), or 'hf:<folder>', a Hugging "
        "Face model folder (docs/finetune.md). None = demo GPT.",
    )
    vocab_size: int = _f(16, "Demo GPT: vocabulary size (also the modulus of the demo task).", ge=2)
    d_model: int = _f(64, "Demo GPT: width.", ge=8)
    n_layers: int = _f(2, "Demo GPT: number of transformer blocks.", ge=1)
    n_heads: int = _f(4, "Demo GPT: attention heads (must divide d_model).", ge=1)
    seq_len: int = _f(16, "Demo GPT/task: tokens per sample.", ge=4)
    dropout: float = _f(0.0, "Demo GPT: dropout probability.", ge=0.0, lt=1.0)

    def demo_params(self) -> int | None:
        """The demo GPT's parameter count (train_entry/model.py: token and position embeddings,
        n_layers blocks of 12 d^2 + 13 d, the final norm, an untied head); None for a factory's
        model, whose size is known only once built."""
        if self.factory is not None:
            return None
        v, d, n, s = self.vocab_size, self.d_model, self.n_layers, self.seq_len
        return 2 * v * d + s * d + n * (12 * d * d + 13 * d) + 2 * d


class DataConfig(_Section):
    factory: str | None = _f(
        None,
        "Your data: 'pkg.module:factory' returning a map-style Dataset, or "
        "an IterableDataset with state_dict()/load_state_dict(). None = demo task.",
    )
    collate: str | None = _f(None, "Optional 'pkg.module:fn' collate function (default: torch's).")
    num_samples: int = _f(65536, "Demo task: samples per epoch.", ge=1)
    num_workers: int = _f(
        0,
        "DataLoader worker processes (0 = load in the training process; the "
        "resume position stays exact either way).",
        ge=0,
    )
    shuffle: bool = _f(
        True, "Shuffle map-style data each epoch (DistributedSampler(seed) + set_epoch)."
    )
    record_ids: bool = _f(
        False,
        "Append the index of every sample read (map-style data) to RUN/samples/rank-N.jsonl: the "
        "proof that a resume, also on another world size, skips and repeats none "
        "(docs/checkpoint-resume.md).",
    )


class OptimConfig(_Section):
    name: Literal["adamw", "sgd"] = _f("adamw", "Optimizer: adamw or sgd.")
    lr: float = _f(
        3e-3,
        "Peak learning rate (after warmup); 0 leaves the weights as loaded (with weight_decay 0: "
        "a check that a pretrained model's load and export are exact).",
        ge=0,
    )
    betas: tuple[float, float] = _f((0.9, 0.95), "AdamW betas.")
    eps: float = _f(1e-8, "AdamW epsilon.", gt=0)
    weight_decay: float = _f(0.0, "Decoupled weight decay (AdamW) / L2 (SGD).", ge=0)
    momentum: float = _f(0.9, "SGD momentum.", ge=0)


class ScheduleConfig(_Section):
    warmup_steps: int = _f(5, "Linear warmup from 0 to optim.lr over this many steps.", ge=0)
    decay: Literal["cosine", "linear", "constant"] = _f("cosine", "Decay after warmup.")
    min_lr_ratio: float = _f(0.1, "Final lr as a fraction of optim.lr.", ge=0, le=1)


class TrainSection(_Section):
    max_steps: int = _f(100, "Optimizer steps to run in total (across restarts).", ge=1)
    global_batch: int = _f(16, "Samples per optimizer step over all ranks.", ge=1)
    micro_batch: int = _f(8, "Samples per forward pass on one rank.", ge=1)
    grad_accum: int | None = _f(
        None,
        "Micro-steps per optimizer step; None = derived from "
        "global_batch / (world_size x micro_batch).",
        ge=1,
    )
    clip_grad_norm: float | None = _f(
        1.0, "Clip the global gradient norm to this (None = off).", gt=0
    )
    precision: Literal["fp32", "bf16", "fp16"] = _f(
        "fp32", "Compute precision (bf16/fp16 autocast; fp16 uses a loss scaler)."
    )
    activation_checkpointing: bool = _f(False, "Recompute each block's activations in backward.")
    compile: bool = _f(False, "torch.compile each block.")
    seed: int = _f(1234, "Seed: model init uses it on every rank, other RNG uses (seed, rank).")
    log_every: int = _f(1, "Write metrics every N steps.", ge=1)
    timeout_min: float = _f(10.0, "Process group timeout in minutes.", gt=0)
    tensorboard: bool = _f(
        False,
        "Also write TensorBoard events to <run>/tensorboard (needs "
        "`pip install tensorboard`); the same as tracker=tensorboard.",
    )
    tracker: Literal["none", "tensorboard", "mlflow", "wandb"] = _f(
        "none",
        "Experiment tracker: one tracker run per hpctrain run, continued across requeues "
        "and resumes (its id in <run>/tracker.json); pip install 'hpctrain[mlflow]' (or wandb, "
        "tensorboard).",
    )
    tracker_project: str | None = _f(None, "Tracker project / experiment name (default hpctrain).")


class DDPConfig(_Section):
    bucket_cap_mb: float = _f(25.0, "Gradient bucket size in MiB.", gt=0)
    gradient_as_bucket_view: bool = _f(True, "Gradients are views into the buckets (saves a copy).")
    broadcast_buffers: bool = _f(True, "Broadcast buffers from rank 0 each forward.")
    static_graph: bool = _f(False, "The graph is the same every step (lets DDP optimise).")
    find_unused_parameters: bool = _f(False, "Allow parameters that get no gradient (slower).")
    comm_hook: Literal["none", "powersgd", "fp16"] = _f("none", "Gradient compression hook.")
    powersgd_rank: int = _f(1, "PowerSGD matrix approximation rank.", ge=1)


class FSDPConfig(_Section):
    reshard_after_forward: bool = _f(
        True,
        "Free gathered parameters after forward (False = "
        "SHARD_GRAD_OP behaviour: more memory, less communication).",
    )
    param_dtype: Literal["fp32", "bf16", "fp16"] | None = _f(
        None, "Parameter dtype for compute; None = train.precision."
    )
    reduce_dtype: Literal["fp32", "bf16", "fp16"] = _f("fp32", "Gradient reduction dtype.")
    cpu_offload: bool = _f(
        False, "Keep sharded parameters, gradients and optimizer state on the CPU."
    )
    block_class: str | None = _f(
        None,
        "Class name of the blocks to shard one by one; None = the "
        "children of the model's ModuleLists.",
    )


class DeepSpeedConfig(_Section):
    zero_stage: int = _f(2, "ZeRO stage 0-3.", ge=0, le=3)
    offload_optimizer: Literal["none", "cpu", "nvme"] = _f("none", "Optimizer state offload.")
    offload_param: Literal["none", "cpu", "nvme"] = _f("none", "Parameter offload (stage 3 only).")
    nvme_path: str | None = _f(None, "Folder for NVMe offload (required with nvme).")
    config_file: str | None = _f(None, "A DeepSpeed JSON to merge over the generated one.")


class ParallelConfig(_Section):
    tp: int = _f(
        1,
        "Tensor parallel size: each layer's matrices split over this many ranks of one node "
        "(1 = off). Needs a TP plan (parallel.tp_plan; the demo GPT has one).",
        ge=1,
    )
    pp: int = _f(
        1,
        "Pipeline parallel size: the layers split into this many stages (1 = off). Needs a "
        "split (parallel.pp_split; the demo GPT has one). Data parallel fills the rest: "
        "dp = world / (tp x pp).",
        ge=1,
    )
    microbatches: int | None = _f(
        None,
        "Pipeline microbatches each rank's micro-batch is cut into; None = pp. More shrink "
        "the bubble (p-1)/(m+p-1).",
        ge=1,
    )
    schedule: Literal[mesh.SCHEDULES] = _f(  # type: ignore[valid-type]  # one table's names
        mesh.DEFAULT_SCHEDULE,
        "Pipeline schedule: gpipe, 1f1b or interleaved_1f1b (2 stages per rank).",
    )
    tp_plan: str | None = _f(
        None,
        "Your TP plan: 'pkg.module:fn', called as fn(model, tp_mesh, config) to apply "
        "parallelize_module to the model in place. None = the demo GPT's "
        "(train_entry/parallel/gpt.py; the worked example is examples/gpt_parallel.py).",
    )
    pp_split: str | None = _f(
        None,
        "Your pipeline split: 'pkg.module:fn', called as fn(model, stage_ids, n_stages, config), "
        "returning (this rank's stage modules, loss_fn(output, target)). None = the demo GPT's.",
    )
    loss_parallel: bool = _f(
        True,
        "With tp: the TP plan leaves the logits sharded on the vocabulary and the loss runs under "
        "loss_parallel() (no all-gather of the logits). Set false if your plan replicates them.",
    )


class CheckpointConfig(_Section):
    every_steps: int | None = _f(
        None, "Save every N steps (None = only at the end and on preemption).", ge=1
    )
    every_minutes: float | None = _f(
        None, "Save when this many minutes passed since the last save.", gt=0
    )
    keep: int = _f(
        2, "Verified checkpoints to keep (at least 2: the newest may be half written).", ge=2
    )
    async_save: bool = _f(False, "Save in the background (periodic saves only).")


class SnapshotConfig(_Section):
    every_steps: int | None = _f(
        None,
        "In-memory snapshot every N steps, for in-job restarts (docs/recovery.md). None = as "
        "often as their cost stays under `budget` of a step; 0 = off.",
        ge=0,
    )
    budget: float = _f(
        snapshot_store.BUDGET,
        "With every_steps None: the share of a step's time snapshots may cost.",
        gt=0,
        le=1,
    )


class ProfileConfig(_Section):
    active: int = _f(
        0, "Steps to record with torch.profiler (0 = off); trace in <run>/profile/.", ge=0
    )
    wait: int = _f(1, "Steps to skip before warming up the profiler.", ge=0)
    warmup: int = _f(1, "Profiler warmup steps (traced, discarded).", ge=0)


class TrainConfig(_Section):
    """The whole trainer configuration (one source of truth for its keys)."""

    strategy: Literal[strategy_names.NAMES] = _f(  # type: ignore[valid-type]  # one table's names
        "ddp", "ddp, fsdp (FSDP2) or deepspeed (ZeRO)."
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="The model.")
    data: DataConfig = Field(default_factory=DataConfig, description="The data.")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="The optimizer.")
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, description="LR schedule.")
    train: TrainSection = Field(default_factory=TrainSection, description="The loop.")
    ddp: DDPConfig = Field(default_factory=DDPConfig, description="DDP knobs.")
    fsdp: FSDPConfig = Field(default_factory=FSDPConfig, description="FSDP2 knobs.")
    deepspeed: DeepSpeedConfig = Field(
        default_factory=DeepSpeedConfig, description="DeepSpeed knobs."
    )
    parallel: ParallelConfig = Field(
        default_factory=ParallelConfig,
        description="Tensor and pipeline parallel on one device mesh (with fsdp).",
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoints."
    )
    snapshot: SnapshotConfig = Field(
        default_factory=SnapshotConfig, description="In-memory snapshots."
    )
    profile: ProfileConfig = Field(default_factory=ProfileConfig, description="torch.profiler.")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# ---------------------------------------------------------------- the key catalogue (for help and fixes)


def all_keys(model: type[BaseModel] = TrainConfig, prefix: str = "") -> dict[str, str]:
    """Every dotted key -> its description, in declaration order."""
    out: dict[str, str] = {}
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out.update(all_keys(ann, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = field.description or ""
    return out


def keys_help() -> str:
    defaults = _flatten(TrainConfig().model_dump(mode="json"))
    lines = []
    for key, desc in all_keys().items():
        lines.append(f"  --{key}={defaults.get(key)!s:<10} {desc}")
    return "\n".join(lines)


def _flatten(d: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
