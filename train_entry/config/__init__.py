"""TrainConfig: every knob of the trainer, validated like site profiles.

Layers, lowest first: the defaults below < the YAML file (`--config`) < dotted flags (`--optim.lr=3e-4`).
Every error names where the value came from (file:line or the flag), the key and the fix; all problems
are reported at once (ValidationError, exit code 2). This module imports no torch: `--print-config` and
config errors stay fast.
"""

from train_entry.config.load import (
    apply_overrides,
    check_sizes,
    load_config,
    world_size,
)
from train_entry.config.models import (
    STRATEGIES,
    CheckpointConfig,
    DataConfig,
    DDPConfig,
    DeepSpeedConfig,
    FSDPConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    ProfileConfig,
    ScheduleConfig,
    TrainConfig,
    TrainSection,
    all_keys,
    keys_help,
)

__all__ = [
    "STRATEGIES",
    "CheckpointConfig",
    "DDPConfig",
    "DataConfig",
    "DeepSpeedConfig",
    "FSDPConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "ProfileConfig",
    "ScheduleConfig",
    "TrainConfig",
    "TrainSection",
    "all_keys",
    "apply_overrides",
    "check_sizes",
    "keys_help",
    "load_config",
    "world_size",
]
