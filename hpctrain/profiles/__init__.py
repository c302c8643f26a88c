"""Site profiles: the schema (schema.py) and how files become a resolved Profile (load.py).

from hpctrain.profiles import resolve, discover, Profile
profile = resolve("generic-ib", {"slurm.qos": "high"})
profile.slurm.gpus_per_node, profile.origins["slurm.qos"]  # -> 8, "flag slurm.qos"
"""

from typing import TYPE_CHECKING

from hpctrain.profiles import schema
from hpctrain.profiles.discovery import Entry, discover
from hpctrain.profiles.load import resolve, resolve_file

if TYPE_CHECKING:  # the name __getattr__ below loads on first use, typed for mypy
    from hpctrain.profiles.schema.profile import Profile as Profile

__all__ = ["Entry", "Profile", "discover", "resolve", "resolve_file"]


def __getattr__(name: str) -> object:
    # The schema (pydantic) is imported on first use only: see profiles/cache.py.
    if name == "Profile":
        return schema.Profile
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
