"""Site profiles: the schema (schema.py) and how files become a resolved Profile (load.py).

from hpctrain.profiles import resolve, discover, Profile
profile = resolve("generic-ib", {"slurm.qos": "high"})
profile.slurm.gpus_per_node, profile.origins["slurm.qos"]  # -> 8, "flag slurm.qos"
"""

from typing import Any

from hpctrain.profiles import schema
from hpctrain.profiles.discovery import Entry, discover
from hpctrain.profiles.load import resolve, resolve_file

__all__ = ["Entry", "Profile", "discover", "resolve", "resolve_file"]


def __getattr__(name: str) -> Any:
    # The schema (pydantic) is imported on first use only: see profiles/cache.py.
    if name == "Profile":
        return schema.Profile
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
