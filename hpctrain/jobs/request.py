"""JobRequest: what the user asked for (name, topology, time, strategy, entry, args), checked against
the resolved profile. It is the ONE source of the topology: nodes and GPUs per node flow from here into
#SBATCH, srun and torchrun, never from anywhere else."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Mapping
from dataclasses import asdict, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.kernel import strategies as strategy_names
from hpctrain.kernel.errors import Problem, ValidationError
from hpctrain.kernel.values import frozen

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile

NAME_RULE = "1-64 characters: letters, digits, '.', '_', '-', starting with a letter or digit"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
STRATEGIES = strategy_names.CHOICES
NODE_NAMES_RE = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9_.\[\],-]*\Z"
)  # Slurm host names and ranges: n1,gpu[01-04]
TRAIN_ENTRY = "train_entry"
# runs a user's script or module as Python would, then ends it past torch's exit-time aborts
USER_ENTRY = "hpctrain.launchers.entry"


MAX_COUNT = 100_000  # nodes or GPUs per node: anything above is a typo (or 10**24)
MAX_TIME_MIN = 366 * 24 * 60


def local_limit() -> int:
    """How many workers the local executor may start here: 4 per CPU core (at least 8)."""
    return max(8, 4 * (os.cpu_count() or 1))


@frozen
class Entry:
    """What torchrun runs on every node: the bundled train_entry, a user script or a user module."""

    kind: str = "train_entry"  # train_entry | script | module
    target: str = TRAIN_ENTRY  # module name, or the absolute path of the script

    def argv(self, *, run_dir: str, strategy: str, args: tuple[str, ...]) -> list[str]:
        """The arguments after `torchrun <options>`."""
        if self.kind == "script":
            return ["-m", USER_ENTRY, self.target, *args]
        if self.kind == "module":
            return ["-m", USER_ENTRY, "-m", self.target, *args]
        return ["-m", TRAIN_ENTRY, "--run-dir", run_dir, "--strategy", strategy, *args]


@frozen
class JobRequest:
    name: str
    nodes: int
    gpus: int  # per node: GPUs on Slurm, CPU worker processes per simulated node locally
    time_min: int
    strategy: str = strategy_names.DEFAULT
    entry: Entry = field(default_factory=Entry)
    args: tuple[str, ...] = ()
    min_nodes: int | None = (
        None  # fewest nodes the run may continue on (preflight shrink, #SBATCH --nodes=M-N)
    )
    exclude: tuple[str, ...] = ()  # nodes Slurm must not give this job (#SBATCH --exclude)

    @property
    def node_range(self) -> bool:
        """The request allows fewer nodes than asked for."""
        return self.min_nodes is not None and self.min_nodes < self.nodes

    def allocated(self, profile: ResolvedProfile) -> int:
        """Nodes the allocation holds: the training nodes and the hot spares
        (preemption.spare_nodes, Slurm only)."""
        return self.nodes + self.spares(profile)

    @staticmethod
    def spares(profile: ResolvedProfile) -> int:
        return profile.preemption.spare_nodes if profile.scheduler == "slurm" else 0

    @classmethod
    def build(
        cls,
        profile: ResolvedProfile,
        *,
        name: str | None = None,
        nodes: int | None = None,
        gpus: int | None = None,
        time_min: int | None = None,
        strategy: str | None = None,
        script: str | None = None,
        module: str | None = None,
        args: tuple[str, ...] | list[str] = (),
        min_nodes: int | None = None,
        exclude: tuple[str, ...] | list[str] = (),
    ) -> JobRequest:
        """Fill the defaults from the profile and check everything; every problem is raised at once."""
        problems: list[Problem] = []
        if script and module:
            problems.append(Problem("give --script or --module, not both", key="entry"))
        entry = Entry()
        if script:
            path = Path(script).expanduser().resolve()
            if not path.is_file():
                problems.append(
                    Problem(
                        f"{script} is not a file (give the path of your training script)",
                        key="--script",
                    )
                )
            entry = Entry("script", str(path))
        elif module:
            if not MODULE_RE.match(module):
                problems.append(
                    Problem(
                        f"{module!r} is not a Python module name (like pkg.train)", key="--module"
                    )
                )
            entry = Entry("module", module)
        slurm = profile.slurm
        default_gpus = (
            slurm.gpus_per_node if profile.scheduler == "slurm" and slurm.gpus_per_node else 1
        )
        if name is None:
            stem = (
                Path(script).stem if script else (module.rsplit(".", 1)[-1] if module else "train")
            )
            name = f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        req = cls(
            name=name,
            nodes=1 if nodes is None else nodes,
            gpus=default_gpus if gpus is None else gpus,
            time_min=slurm.default_time_min if time_min is None else time_min,
            strategy=strategy or strategy_names.DEFAULT,
            entry=entry,
            args=tuple(args),
            min_nodes=min_nodes,
            exclude=tuple(e for item in exclude for e in str(item).split(",") if e),
        )
        problems += req.problems(profile)
        if problems:
            raise ValidationError(problems)
        return req

    def with_strategy(self, strategy: str) -> JobRequest:
        """This request with another strategy (train_entry's config chose it), checked again."""
        req = dataclasses.replace(self, strategy=strategy)
        problems = req._strategy()
        if problems:
            raise ValidationError(problems)
        return req

    def problems(self, profile: ResolvedProfile) -> list[Problem]:
        """Everything wrong with this request for this profile, each with its fix."""
        return [
            *self._name(),
            *self._strategy(),
            *self._counts(),
            *self._args(),
            *self._sizes(),
            *self._fit(profile),
        ]

    def _name(self) -> list[Problem]:
        if NAME_RE.match(self.name):
            return []
        return [Problem(f"{self.name!r} is not a valid run name ({NAME_RULE})", key="--name")]

    def _strategy(self) -> list[Problem]:
        if self.strategy not in STRATEGIES:
            return [
                Problem(
                    f"unknown strategy {self.strategy!r}; use one of {', '.join(STRATEGIES)}",
                    key="--strategy",
                )
            ]
        known = strategy_names.STRATEGIES.get(self.strategy)  # None: auto, the planner's choice
        shrinks = self.min_nodes is not None and 1 <= self.min_nodes < self.nodes
        if shrinks and known and not known.reshards:
            return [Problem(f"--min-nodes: {known.no_shrink}", key="--min-nodes")]
        return []

    def _counts(self) -> list[Problem]:
        """The topology and the time, each at least 1; the node names Slurm must leave out."""
        out: list[Problem] = []
        if self.nodes < 1:
            out.append(Problem(f"--nodes {self.nodes}: at least 1 node", key="--nodes"))
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            out.append(
                Problem(
                    f"--min-nodes {self.min_nodes}: between 1 and --nodes ({self.nodes})",
                    key="--min-nodes",
                )
            )
        out += [
            Problem(
                f"--exclude {name!r} is not a Slurm node name or range (like n1 or gpu[01-04])",
                key="--exclude",
            )
            for name in self.exclude
            if not NODE_NAMES_RE.match(name)
        ]
        if self.gpus < 1:
            out.append(Problem(f"--gpus {self.gpus}: at least 1 per node", key="--gpus"))
        if self.time_min < 1:
            out.append(Problem(f"--time {self.time_min}: at least 1 minute", key="--time"))
        return out

    def _args(self) -> list[Problem]:
        return [
            Problem(
                f"entry argument {i + 1} ({arg.encode('utf-8', 'surrogateescape')[:40]!r}) "
                "is not valid UTF-8 text; fix: pass it in UTF-8",
                key="--",
            )
            for i, arg in enumerate(self.args)
            if any(0xD800 <= ord(c) <= 0xDFFF for c in arg) or "\x00" in arg
        ]

    def _sizes(self) -> list[Problem]:
        """Counts no machine has: a typo (or 10**24)."""
        return [
            Problem(
                f"{key} {str(value)[:24]} is not a realistic value (at most {most}); "
                f"fix: give {key} a real count",
                key=key,
            )
            for key, value, most in (
                ("--nodes", self.nodes, MAX_COUNT),
                ("--gpus", self.gpus, MAX_COUNT),
                ("--time", self.time_min, MAX_TIME_MIN),
            )
            if value > most
        ]

    def _fit(self, profile: ResolvedProfile) -> list[Problem]:
        """What the profile allows: its nodes, GPUs per node, time, spares; this machine's workers."""
        out: list[Problem] = []
        slurm, spares = profile.slurm, profile.preemption.spare_nodes
        where = f"profile {profile.name}"
        on_slurm = profile.scheduler == "slurm"
        if not on_slurm and MAX_COUNT >= self.nodes * self.gpus > local_limit():
            out.append(
                Problem(
                    f"--nodes {self.nodes} x --gpus {self.gpus} = {self.nodes * self.gpus} local "
                    f"workers, more than this machine runs ({local_limit()}: 4 per CPU core); "
                    "fix: fewer --nodes or --gpus, or a Slurm profile",
                    key="--nodes",
                )
            )
        if on_slurm and slurm.gpus_per_node and self.gpus > slurm.gpus_per_node:
            out.append(
                Problem(
                    f"--gpus {self.gpus} is more than the {slurm.gpus_per_node} GPUs per node of "
                    f"{where}; use --gpus {slurm.gpus_per_node} and more --nodes",
                    key="--gpus",
                )
            )
        if spares and not on_slurm:
            out.append(
                Problem(
                    f"--spare-nodes {spares} (preemption.spare_nodes): hot spares are nodes of a "
                    f"Slurm allocation, and {where} runs on this machine; fix: --spare-nodes 0, "
                    "or a Slurm profile",
                    key="--spare-nodes",
                )
            )
        return out + self._limits(profile)

    def _limits(self, profile: ResolvedProfile) -> list[Problem]:
        """slurm.max_nodes (the spares included) and slurm.max_time_min."""
        out: list[Problem] = []
        slurm, spares = profile.slurm, profile.preemption.spare_nodes
        where = f"profile {profile.name}"
        if slurm.max_nodes is not None and self.nodes > slurm.max_nodes:
            out.append(
                Problem(
                    f"--nodes {self.nodes} is more than the {slurm.max_nodes} nodes {where} "
                    f"allows; use --nodes {slurm.max_nodes} or fewer",
                    key="--nodes",
                )
            )
        elif slurm.max_nodes is not None and spares and self.nodes + spares > slurm.max_nodes:
            out.append(
                Problem(
                    f"--nodes {self.nodes} + --spare-nodes {spares} = {self.nodes + spares} nodes "
                    f"to allocate, more than the {slurm.max_nodes} {where} allows; fix: fewer "
                    "--spare-nodes or --nodes",
                    key="--spare-nodes",
                )
            )
        if slurm.max_time_min is not None and self.time_min > slurm.max_time_min:
            out.append(
                Problem(
                    f"--time {self.time_min} is more than the {slurm.max_time_min} minutes "
                    f"{where} allows; use --time {slurm.max_time_min} or less, or add --chain to "
                    f"run it as {-(-self.time_min // slurm.max_time_min)} jobs one after another, "
                    "each resuming from the newest checkpoint",
                    key="--time",
                )
            )
        return out

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["args"] = list(self.args)
        d["exclude"] = list(self.exclude)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobRequest:  # Any: run.yaml's request (YAML)
        fields = dict(d)
        fields["entry"] = Entry(**fields.get("entry", {}))
        fields["args"] = tuple(fields.get("args", ()))
        fields["exclude"] = tuple(fields.get("exclude", ()))
        return cls(**fields)
