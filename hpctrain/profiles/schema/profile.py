"""The top level of a profile, and the key lookups the loader uses."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, PrivateAttr, field_validator

from hpctrain.kernel import shell
from hpctrain.kernel.plugins import SCHEDULERS
from hpctrain.profiles.health import Preflight, Watchdog
from hpctrain.profiles.schema import checks
from hpctrain.profiles.schema.base import TORCHRUN_SECTION, Strict
from hpctrain.profiles.schema.environment import Environment
from hpctrain.profiles.schema.launch import Launch, Preemption, Rendezvous, Storage
from hpctrain.profiles.schema.login import Login
from hpctrain.profiles.schema.slurm import Network, Slurm

UNSUPPORTED_SCHEDULERS = {
    "pbs": "PBS Pro",
    "pbspro": "PBS Pro",
    "pbs_pro": "PBS Pro",
    "pbs pro": "PBS Pro",
    "openpbs": "PBS Pro",
    "torque": "Torque (PBS)",
    "lsf": "IBM LSF",
    "sge": "Grid Engine",
    "uge": "Grid Engine",
    "flux": "Flux",
    "htcondor": "HTCondor",
    "condor": "HTCondor",
    "kubernetes": "Kubernetes",
    "k8s": "Kubernetes",
}


def _locked_key(key: str) -> str:
    if key.split(".")[0] in ("name", "extends", "locked"):
        raise ValueError(f"{key!r} cannot be locked; fix: remove it from locked")
    if not key_exists(key):
        raise ValueError(
            f"locked key {key!r} is not a profile key; fix: use dotted keys "
            "such as 'slurm.account' or a section such as 'network'"
        )
    return key


LockedKey = Annotated[str, AfterValidator(_locked_key)]


class Profile(Strict):
    """A site profile: everything hpctrain needs to know about one cluster."""

    name: str = Field(description="Profile name, also its file name (`NAME.yaml`).")
    description: str = Field("", description="One line shown by `hpctrain profiles list`.")
    version: str = Field(
        "1", description="The admin's version of this profile (a number is read as text)."
    )
    extends: str | None = Field(
        None,
        description="Profile this one builds on: a name (found by discovery) or a path "
        "(relative to this file). Chains are allowed, cycles are rejected.",
    )
    scheduler: Literal[tuple(SCHEDULERS)] = Field(  # type: ignore[valid-type]
        "slurm", description="`slurm`, or `local` (submitit's local executor on this machine)."
    )
    template: str | None = Field(
        None,
        description="The script template for this profile (`NAME.j2`, found in the site "
        "folders' `templates/`); null: `sbatch.sh.j2` (the site's override, "
        "else hpctrain's).",
    )
    slurm: Slurm = Field(default_factory=Slurm, description="Slurm request settings.")
    network: Network = Field(default_factory=Network, description="Network settings.")
    launch: Launch = Field(default_factory=Launch, description="How the training processes start.")
    environment: Environment = Field(default_factory=Environment, description="Node set-up.")
    storage: Storage = Field(default_factory=Storage, description="Where run folders live.")
    rendezvous: Rendezvous = Field(
        default_factory=Rendezvous, description="Rendezvous head and port."
    )
    preemption: Preemption = Field(default_factory=Preemption, description="Preemption handling.")
    login: Login | None = Field(
        None,
        description="Reach the site over SSH from another machine "
        "(docs/remote.md); null: this machine is the login node.",
    )
    preflight: Preflight = Field(
        default_factory=Preflight, description="Node checks before training (docs/bad-nodes.md)."
    )
    watchdog: Watchdog = Field(
        default_factory=Watchdog, description="Collective timeouts and the stall heartbeat."
    )
    locked: list[LockedKey] = Field(
        default_factory=list,
        description="Dotted keys (or whole sections) that profiles extending this one, the user's "
        "config and command-line flags may not change.",
    )

    _origins: dict[str, str] = PrivateAttr(default_factory=dict)
    _source: Path | None = PrivateAttr(None)
    _chain: list[Path] = PrivateAttr(default_factory=list)

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: object) -> object:
        return str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v

    @field_validator("scheduler", mode="before")
    @classmethod
    def _scheduler(cls, v: object) -> object:
        if isinstance(v, str) and v.strip().lower() in UNSUPPORTED_SCHEDULERS:
            raise ValueError(
                f"{v!r}: {UNSUPPORTED_SCHEDULERS[v.strip().lower()]} is not supported; hpctrain "
                "submits to Slurm (`slurm`) or runs on this machine (`local`); fix: on a "
                "Slurm cluster write `scheduler: slurm`; inside one node of a job of that "
                "scheduler (an interactive job), `scheduler: local` trains on that node"
            )
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return checks.check_profile_name(v)

    @field_validator("template")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None and not checks.TEMPLATE_NAME.match(v):
            raise ValueError(
                f"template {v!r} is not a template file name; fix: a plain file name "
                "ending in .j2 (no folders), e.g. 'mycluster.sh.j2'"
            )
        return v

    @field_validator("description", "extends")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        return None if v is None else checks.check_text(v)

    def _checks(self) -> list[tuple[str, str]]:
        if self.launch.launcher == "srun" and self.scheduler != "slurm":
            return [
                (
                    "launch",
                    "launch.launcher srun needs scheduler slurm (srun starts the tasks); "
                    "fix: use launcher torchrun with scheduler local",
                )
            ]
        return self._torchrun_locks()

    def _torchrun_locks(self) -> list[tuple[str, str]]:
        """A torchrun option that sets what a locked section decides (`--local-addr`, or a prefix
        torchrun expands to it, is the rendezvous address) is refused, unless the lock also holds
        launch.torchrun_args: then only the locking profile can have written it."""
        locks = list(self.locked)

        def held(key: str) -> str | None:
            return next((k for k in locks if k == key or k.startswith(key + ".")), None)

        if any(k in ("launch", "launch.torchrun_args") for k in locks):
            return []
        out = []
        for arg in self.launch.torchrun_args:
            word = arg.split("=", 1)[0].removeprefix("--").replace("_", "-")
            for option, section in TORCHRUN_SECTION.items():
                lock = held(section)
                if lock and word and option.startswith(word):
                    out.append(
                        (
                            "launch",
                            f"launch.torchrun_args {arg!r}: torchrun reads it as --{option}, "
                            f"which {section} decides, and {lock} is locked; fix: remove it (the "
                            f"locking profile may set it and lock launch.torchrun_args too)",
                        )
                    )
        return out

    @property
    def warnings(self) -> list[str]:
        """Valid but risky choices, printed by `profiles validate`."""
        out = []
        if self.preemption.signal == "USR1":
            out.append(
                "preemption.signal USR1: NCCL and some launchers use USR1 themselves, so "
                "the warning may be lost; prefer USR2"
            )
        if self.preemption.requeue and self.preemption.max_restarts == 0:
            out.append("preemption.requeue is true but max_restarts is 0: nothing is requeued")
        return out

    @property
    def origins(self) -> dict[str, str]:
        """Dotted key -> where its value came from ("file:line", "default", "user config ...",
        "flag ...")."""
        return self._origins

    @property
    def source(self) -> Path | None:
        """The profile file that was asked for (top of the extends chain)."""
        return self._source

    @property
    def chain(self) -> list[Path]:
        """Files of the extends chain, the asked-for file first."""
        return self._chain


SECTIONS: dict[str, type[BaseModel]] = {
    "slurm": Slurm,
    "network": Network,
    "launch": Launch,
    "environment": Environment,
    "storage": Storage,
    "rendezvous": Rendezvous,
    "preemption": Preemption,
    "preflight": Preflight,
    "watchdog": Watchdog,
}


def model_at(path: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model class that holds the key at `path` (its parent), or None if not a model."""
    model: type[BaseModel] = Profile
    for part in path[:-1]:
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        inner = _model_of(field.annotation)
        if inner is None:
            return None
        model = inner
    return model


def _model_of(annotation: object) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def key_exists(dotted: str) -> bool:
    """True for a field or section of the schema, or any NAME under an env mapping."""
    parts = dotted.split(".")
    model: type[BaseModel] | None = Profile
    for i, part in enumerate(parts):
        if model is None:
            return False
        field = model.model_fields.get(part)
        if field is None:
            return False
        if part in ("env", "task_env") and i == len(parts) - 2:
            return bool(shell.ENV_NAME.match(parts[-1]))
        model = _model_of(field.annotation)
    return True
