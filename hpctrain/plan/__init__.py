"""hpctrain plan: per-GPU memory under every strategy, and the one to use.

model.py   the memory model: what each strategy holds per rank (measured, tests/test_plan_memory.py)
ladder.py  the decision tree and out-of-memory ladder, and the pick
network.py  bytes per GPU per step inside and between nodes, and the estimated step the pick weighs
auto.py    recommend(): the plan as a function, for `submit --strategy auto`
inputs.py  the model size (a count or a factory on the meta device) and the GPU memory -> Workload
snapshots.py  the node-local memory of the in-memory snapshots (`plan`'s last line, --dry-run)
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names __getattr__ below loads on first use, typed for mypy
    from hpctrain.plan.auto import recommend as recommend
    from hpctrain.plan.inputs import count_params as count_params
    from hpctrain.plan.inputs import workload as workload
    from hpctrain.plan.ladder import Plan as Plan
    from hpctrain.plan.ladder import Recommendation as Recommendation
    from hpctrain.plan.ladder import gib as gib
    from hpctrain.plan.ladder import make_plan as make_plan
    from hpctrain.plan.ladder import no_fit_message as no_fit_message
    from hpctrain.plan.model import BY_NAME as BY_NAME
    from hpctrain.plan.model import CUDA_CONTEXT_BYTES as CUDA_CONTEXT_BYTES
    from hpctrain.plan.model import GIB as GIB
    from hpctrain.plan.model import HEADROOM as HEADROOM
    from hpctrain.plan.model import LADDER as LADDER
    from hpctrain.plan.model import LAYOUTS as LAYOUTS
    from hpctrain.plan.model import OPTIMIZERS as OPTIMIZERS
    from hpctrain.plan.model import PRECISIONS as PRECISIONS
    from hpctrain.plan.model import Estimate as Estimate
    from hpctrain.plan.model import Layout as Layout
    from hpctrain.plan.model import Workload as Workload
    from hpctrain.plan.model import activation_bytes as activation_bytes
    from hpctrain.plan.model import estimate as estimate
    from hpctrain.plan.model import model_state as model_state

# Imported on first use (PEP 562): `submit --dry-run` plans its snapshots with snapshots.py and
# model.py alone, without the ladder, the network model and the model-size readers.
_WHERE = {
    "recommend": "auto",
    **dict.fromkeys(("count_params", "workload"), "inputs"),
    **dict.fromkeys(("Plan", "Recommendation", "gib", "make_plan", "no_fit_message"), "ladder"),
    **dict.fromkeys(
        (
            "BY_NAME",
            "CUDA_CONTEXT_BYTES",
            "GIB",
            "HEADROOM",
            "LADDER",
            "LAYOUTS",
            "OPTIMIZERS",
            "PRECISIONS",
            "Estimate",
            "Layout",
            "Workload",
            "activation_bytes",
            "estimate",
            "model_state",
        ),
        "model",
    ),
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
