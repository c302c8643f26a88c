"""hpctrain plan: per-GPU memory under every strategy, and the one to use.

model.py   the memory model: what each strategy holds per rank (measured, tests/test_plan_memory.py)
ladder.py  the decision tree and out-of-memory ladder, and the pick
network.py  bytes per GPU per step inside and between nodes, and the estimated step the pick weighs
auto.py    recommend(): the plan as a function, for `submit --strategy auto`
inputs.py  the model size (a count or a factory on the meta device) and the GPU memory -> Workload
snapshots.py  the node-local memory of the in-memory snapshots (`plan`'s last line, --dry-run)
"""

from hpctrain.plan.auto import recommend
from hpctrain.plan.inputs import count_params, workload
from hpctrain.plan.ladder import Plan, Recommendation, gib, make_plan, no_fit_message
from hpctrain.plan.model import (
    BY_NAME,
    CUDA_CONTEXT_BYTES,
    GIB,
    HEADROOM,
    LADDER,
    LAYOUTS,
    OPTIMIZERS,
    PRECISIONS,
    Estimate,
    Layout,
    Workload,
    activation_bytes,
    estimate,
    model_state,
)

__all__ = [
    "BY_NAME",
    "CUDA_CONTEXT_BYTES",
    "HEADROOM",
    "GIB",
    "LADDER",
    "LAYOUTS",
    "OPTIMIZERS",
    "PRECISIONS",
    "Estimate",
    "Layout",
    "Plan",
    "Recommendation",
    "Workload",
    "activation_bytes",
    "count_params",
    "estimate",
    "gib",
    "make_plan",
    "model_state",
    "no_fit_message",
    "recommend",
    "workload",
]
