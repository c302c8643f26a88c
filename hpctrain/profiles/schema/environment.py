"""The `environment` section: modules, admin setup lines, activation, variables, the container."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from hpctrain.kernel import shell
from hpctrain.kernel.plugins import CONTAINERS
from hpctrain.profiles.schema import checks
from hpctrain.profiles.schema.base import ContainerFlag, EnvMap, EnvName, Strict, TaskEnvMap

MODULE_OPS = ("load", "unload", "use", "purge", "reset")
CONTAINER_KINDS = tuple(CONTAINERS)


def _module_line(line: str) -> str:
    """`NAME` (= `load NAME`), `load A B`, `unload A`, `use PATH`, `purge`, `reset`."""
    words = line.split(" ")
    op, args = (words[0], words[1:]) if words[0] in MODULE_OPS else ("load", words)
    if op in ("purge", "reset"):
        if args:
            raise ValueError(f"module {line!r}: `{op}` takes no names; fix: write `{op}` alone")
        return line
    if not args:
        raise ValueError(f"module {line!r}: `{op}` needs a name; fix: e.g. `{op} cuda/12.4`")
    for a in args:
        if op == "use":
            checks.check_path_text(a, "module use path")
        elif not checks.MODULE.match(a):
            raise ValueError(
                f"module {a!r} is not a module name; fix: write e.g. 'cuda/12.4' "
                "(letters, digits and _.+/@:-, single spaces between words)"
            )
    return line


def _shell_line(line: str) -> str:
    return checks.check_text(line, "setup line")


def _mount(m: str) -> str:
    parts = m.split(":")
    if "," in m or " " in m or len(parts) > 3 or not all(parts[:2]):
        raise ValueError(
            f"mount {m!r} is not PATH or SRC:DST[:OPTS]; fix: write e.g. '/scratch', "
            "'/scratch:/scratch' or '$HOME/data:/data:ro', no spaces or commas"
        )
    return checks.check_path_text(m, "mount")


ModuleLine = Annotated[str, AfterValidator(_module_line)]
ShellLine = Annotated[str, AfterValidator(_shell_line)]
Mount = Annotated[str, AfterValidator(_mount)]


class Container(Strict):
    """A container every task runs in (one module per kind: hpctrain/containers/)."""

    kind: Literal[CONTAINER_KINDS] = Field(  # type: ignore[valid-type]
        description="`pyxis` (enroot: srun --container-image), `apptainer` / `singularity` "
        "(`BINARY exec|run IMAGE`), `shifter` (`#SBATCH --image`, `srun shifter`), "
        "`edf` (an environment definition file: `srun --environment=IMAGE`)."
    )
    image: str = Field(
        description="pyxis `nvcr.io#nvidia/pytorch:24.05-py3` or a .sqsh; apptainer/singularity a "
        ".sif path or `docker://...`; shifter `docker:nersc/pytorch:24.06.01`; edf the "
        "environment's name or its .toml path. `$VAR` expands on the node (not for "
        "shifter, whose image is an #SBATCH line)."
    )
    mounts: list[Mount] = Field(
        default_factory=list,
        description="Bind mounts `SRC:DST[:OPTS]`, or a bare path mounted at the same place; `$VAR` "
        "expands on the node. The run folder is added itself (edf: the EDF mounts it).",
    )
    workdir: str | None = Field(
        None,
        description="Working directory inside the container (pyxis --container-workdir, "
        "apptainer/singularity --pwd, shifter --workdir).",
    )
    env: list[EnvName] = Field(
        default_factory=list,
        description="pyxis only: variables whose host value overrides the image's "
        "(`--container-env=NAME,...`).",
    )
    modules: list[str] = Field(
        default_factory=list,
        description="shifter only: shifter modules (`#SBATCH --module=gpu,nccl-plugin`).",
    )
    exec: Literal["exec", "run"] = Field(
        "exec",
        description="apptainer/singularity: `exec` the command, or `run` it through the "
        "image's runscript.",
    )
    binary: str | None = Field(
        None,
        description="apptainer/singularity: the program to call (a path or name); null: the kind.",
    )
    flags: list[ContainerFlag] = Field(
        default_factory=list,
        description="Extra options for the container runtime, each `--key[=value]` (pyxis: srun "
        "options such as `--container-writable`; apptainer: e.g. `--cleanenv`). The GPU "
        "flag (`--nv`/`--rocm`) is added from slurm.gpu_vendor.",
    )

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        checks.check_defaults(v, "container.image", word=True)
        if not checks.IMAGE.match(shell.ENV_REF.sub("x", v)):
            raise ValueError(
                f"{v!r} is not an image reference; fix: use letters, digits, "
                "_.:/#@+=- and $VAR, without spaces or quotes, not starting with -"
            )
        return v

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        return None if v is None else checks.check_path_text(v, "workdir")

    @field_validator("binary")
    @classmethod
    def _binary(cls, v: str | None) -> str | None:
        return None if v is None else checks.check_word(v, "binary")

    @field_validator("modules")
    @classmethod
    def _modules(cls, v: list[str]) -> list[str]:
        for m in v:
            if not re.match(r"^[A-Za-z0-9_.+][A-Za-z0-9_.+-]*\Z", m):  # never an option
                raise ValueError(f"shifter module {m!r} is not a name; fix: e.g. gpu, nccl-plugin")
        return v

    def _checks(self) -> list[tuple[str, str]]:
        out = []
        k = self.kind
        if self.env and k != "pyxis":
            out.append(
                (
                    "env",
                    f"container.env is a pyxis option, this container is {k}; fix: put "
                    "the variables in environment.env (they reach the container)",
                )
            )
        if self.modules and k != "shifter":
            out.append(
                (
                    "modules",
                    f"container.modules is a shifter option, this container is {k}; fix: remove it",
                )
            )
        if k not in ("apptainer", "singularity"):
            if self.exec != "exec":
                out.append(
                    (
                        "exec",
                        f"container.exec is for apptainer/singularity, not {k}; fix: remove it",
                    )
                )
            if self.binary is not None:
                out.append(
                    (
                        "binary",
                        f"container.binary is for apptainer/singularity, not {k}; fix: remove it",
                    )
                )
        if k == "edf" and (self.mounts or self.workdir):
            out.append(
                (
                    "mounts",
                    "an edf container takes mounts and workdir from its environment "
                    "definition file; fix: put them in the EDF (it must mount the runs folder)",
                )
            )
        if k == "shifter" and "$" in self.image:
            out.append(
                (
                    "image",
                    "a shifter image is an #SBATCH line, where $VAR does not expand; "
                    "fix: write the image name out",
                )
            )
        return out


class Environment(Strict):
    """What every node and task sets up before launching."""

    modules: list[ModuleLine] = Field(
        default_factory=list,
        description="Module commands, in order, in the batch shell: `NAME` (load), `load A B`, "
        "`unload A`, `use PATH`, `purge`, `reset`. A failed one stops the job with a "
        "message naming it.",
    )
    login_shell: bool = Field(
        False,
        description="Read /etc/profile in the batch shell first, as a login shell would (`bash -l`), "
        "before setup and the modules: a site whose `module` command comes from its login "
        "profile (PDC Dardel). Wrapped in `set +u ... set -u` (profile scripts read unset "
        "variables); a missing /etc/profile stops the job naming this key.",
    )
    setup: list[ShellLine] = Field(
        default_factory=list,
        description="Admin shell lines run in the batch shell before the modules (`ulimit -c 0`, a "
        "per-job cache folder). Trusted admin content, run as written: keep it in site "
        "profiles and lock it (`locked: [environment.setup]`).",
    )
    task_setup: list[ShellLine] = Field(
        default_factory=list,
        description="Admin shell lines run in every task (inside the container, after activation, "
        "before the launch). Trusted admin content, like setup.",
    )
    activate: str | None = Field(
        None,
        description="A venv to activate (path to the venv folder), `conda:NAME` or "
        "`conda:/path/to/env` (an env made with `conda create -p`; $VAR expands on the node): "
        "in the batch shell, or in every task when there is a container (inside it).",
    )
    container: Container | None = Field(
        None, description="Run every task in this container; null: none."
    )
    env: EnvMap = Field(
        default_factory=dict,
        description="Extra environment variables `NAME: value` (mixed case allowed), exported in "
        "the batch shell. Values: `$NAME`, `${NAME}`, `${NAME:-default}` expand on the "
        "node, everything else is literal, `$(...)` and backticks are refused. "
        "Exported by name, a value after the exports it names (a cycle is refused); a "
        "`$NAME` the node does not have ends the job FAILED naming the key (`${NAME:-}` "
        "allows it unset). A value here wins over hpctrain's derived one (OMP_NUM_THREADS). "
        "`NAME: null` removes an inherited entry.",
    )
    task_env: TaskEnvMap = Field(
        default_factory=dict,
        description="Variables exported in every task after RANK/LOCAL_RANK/... are set, so a value "
        "may use them (`$LOCAL_RANK`, `$SLURM_LOCALID`); may set CUDA_VISIBLE_DEVICES, "
        "ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES (a device order).",
    )

    @field_validator("activate")
    @classmethod
    def _activate(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if v.startswith("conda:"):
            env = v.removeprefix("conda:")
            if env.startswith(("/", "$", "~")):  # an env made with `conda create -p PATH`
                checks.check_path_text(env, "activate")
                return v
            if not re.match(r"^[A-Za-z0-9_.+][A-Za-z0-9_.+-]*\Z", env):
                raise ValueError(
                    f"{v!r} is not conda:ENV; fix: write conda:NAME with a plain env name, "
                    "or conda:/path/to/env for an env created with `conda create -p`"
                )
            return v
        checks.check_path_text(v, "activate")
        if not v.startswith(("/", "$", "~")):
            raise ValueError(
                f"activate {v!r} is a relative path; fix: give the absolute path of "
                "the venv folder (or $VAR/...), or conda:ENV"
            )
        return v
