"""Site profiles: the schema (schema.py) and how files become a resolved Profile (load.py).

    from hpctrain.profiles import resolve, discover, Profile
    profile = resolve("generic-ib", {"slurm.qos": "high"})
    profile.slurm.gpus_per_node, profile.origins["slurm.qos"]  # -> 8, "flag slurm.qos"
"""

from hpctrain.profiles.load import Entry, discover, resolve, resolve_file
from hpctrain.profiles.schema import Profile

__all__ = ["Entry", "Profile", "discover", "resolve", "resolve_file"]
