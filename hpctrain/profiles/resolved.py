"""The one static type of a resolved profile, whichever object carries it.

`resolve()` returns either the validated pydantic model (`hpctrain.profiles.schema.Profile`) or,
when the same input was validated before, the cache's `ProfileView` (hpctrain/profiles/cache.py:
the same attributes read from plain data, so the common path never imports pydantic). Both satisfy
`ResolvedProfile`: the model by its fields and properties, the view through its `__getattr__`
(which answers from the cache, else from the model). Every signature that takes a profile says
`profile: ResolvedProfile`; mypy then checks each use against the schema's own section classes.

Import it under `if TYPE_CHECKING:` (the schema's classes are pydantic models); at run time this
module imports nothing but typing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from hpctrain.profiles.cache import ProfileView
    from hpctrain.profiles.health import Preflight, Watchdog
    from hpctrain.profiles.schema.environment import Environment
    from hpctrain.profiles.schema.launch import Launch, Preemption, Rendezvous, Storage
    from hpctrain.profiles.schema.login import Login
    from hpctrain.profiles.schema.profile import Profile
    from hpctrain.profiles.schema.slurm import Network, Slurm


class ResolvedProfile(Protocol):
    """What a resolved profile answers (read-only): the schema's top-level keys, where each value
    came from, and the model's dump."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def extends(self) -> str | None: ...
    @property
    def scheduler(self) -> Literal["slurm", "local"]: ...
    @property
    def template(self) -> str | None: ...
    @property
    def slurm(self) -> Slurm: ...
    @property
    def network(self) -> Network: ...
    @property
    def launch(self) -> Launch: ...
    @property
    def environment(self) -> Environment: ...
    @property
    def storage(self) -> Storage: ...
    @property
    def rendezvous(self) -> Rendezvous: ...
    @property
    def preemption(self) -> Preemption: ...
    @property
    def login(self) -> Login | None: ...
    @property
    def preflight(self) -> Preflight: ...
    @property
    def watchdog(self) -> Watchdog: ...
    @property
    def locked(self) -> list[str]: ...
    @property
    def warnings(self) -> list[str]: ...
    @property
    def origins(self) -> dict[str, str]: ...
    @property
    def source(self) -> Path | None: ...
    @property
    def chain(self) -> list[Path]: ...
    def model_dump(self, *, mode: str = ...) -> dict[str, Any]: ...  # Any: as pydantic's
    def model_copy(self, *, deep: bool = ...) -> ResolvedProfile: ...


if TYPE_CHECKING:  # checked by mypy (make lint), never run: both carriers are a ResolvedProfile

    def _both_carriers(model: Profile, view: ProfileView) -> list[ResolvedProfile]:
        return [model, view]
