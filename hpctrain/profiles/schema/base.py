"""The base of every schema section, the options hpctrain owns, and the annotated value types."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from hpctrain.kernel import jobenv, shell
from hpctrain.profiles.schema import checks


class Strict(BaseModel):
    """Base of every section: unknown keys are errors (a typo is never silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=False, validate_default=False)

    def _checks(self) -> list[tuple[str, str]]:
        """Cross-field checks: (field name, "message; fix: ...") pairs. Override per section."""
        return []

    @model_validator(mode="after")
    def _cross_fields(self) -> Strict:
        items = self._checks()
        if items:
            # One error carrying every item; the loader splits it into one problem per field.
            raise PydanticCustomError(
                "cross_field", "; ".join(m for _, m in items), {"items": items}
            )
        return self


# sbatch/srun options that hpctrain writes itself: a profile may not set them.
TASK_TRES = (
    "hpctrain requests the GPUs and CPUs itself: per node slurm.gpus_per_node (slurm.gpu_type "
    "for the kind), per task launch.task_gpus (launcher srun) and slurm.cpus_per_task"
)
SBATCH_OWNED = {
    "nodes": "the node count comes from `--nodes` on the command line",
    "ntasks": "the launcher decides the tasks (launch.launcher)",
    "ntasks-per-node": "the launcher decides the tasks per node (launch.launcher)",
    "gpus": "GPUs come from slurm.gpus_per_node and slurm.gpu_request",
    "gpus-per-node": "GPUs come from slurm.gpus_per_node and slurm.gpu_request",
    "gpus-per-task": TASK_TRES,
    # the same requests in Slurm's generic form (`--tres-per-task=gres/gpu:1`, Slurm >= 21.08) or
    # per socket: refused like --gpus-per-task, or a second GPU request would contradict the first
    "tres-per-task": TASK_TRES,
    "gpus-per-socket": "GPUs come from slurm.gpus_per_node and slurm.gpu_request",
    "gres": "GPUs come from slurm.gpus_per_node with slurm.gpu_request: gres",
    "signal": "set preemption.signal and preemption.warning_s",
    "requeue": "set preemption.requeue",
    "no-requeue": "set preemption.requeue: false",
    "output": "hpctrain writes logs into the run folder",
    "error": "hpctrain writes logs into the run folder",
    "open-mode": "hpctrain always appends (logs survive requeues)",
    "job-name": "the job name is the run name (`--name`)",
    "time": "set slurm.default_time_min / pass `--time`",
    "array": "hpctrain runs one job per run",
    "wrap": "hpctrain submits its own script",
    "chdir": "hpctrain runs in the run folder",
    "partition": "set slurm.partition",
    "account": "set slurm.account",
    "qos": "set slurm.qos",
    "constraint": "set slurm.constraint",
    "reservation": "set slurm.reservation",
    "exclusive": "set slurm.exclusive: true",
    "mem": "set slurm.mem",
    "cpus-per-task": "set slurm.cpus_per_task",
    "cpus-per-gpu": "set slurm.cpus_per_gpu",
    "image": "set environment.container (kind: shifter)",
    "module": "set environment.container.modules (kind: shifter)",
}
SRUN_OWNED = {
    **{
        k: SBATCH_OWNED[k]
        for k in (
            "nodes",
            "ntasks",
            "ntasks-per-node",
            "gpus",
            "gpus-per-node",
            "gpus-per-task",
            "tres-per-task",
            "gpus-per-socket",
            "gres",
            "output",
            "error",
            "open-mode",
            "job-name",
            "time",
            "chdir",
        )
    },
    "input": "hpctrain's tasks run without stdin",
    "container-image": "set environment.container",
    "container-mounts": "set environment.container.mounts",
    "container-name": "set environment.container",
    "container-workdir": "set environment.container.workdir",
    "container-env": "set environment.container.env",
    "environment": "set environment.container (kind: edf)",
}
# Options that would undo the site's policy or a locked key, refused wherever an option list
# appears (slurm.extra_sbatch, slurm.srun_args, container flags): docs/security.md.
POLICY_OWNED = {
    **{
        k: SBATCH_OWNED[k]
        for k in (
            "partition",
            "account",
            "qos",
            "reservation",
            "constraint",
            "exclusive",
            "mem",
            "cpus-per-task",
            "cpus-per-gpu",
        )
    },
    "export": "the script sets the environment (environment.env); --export would drop or replace it",
    "export-file": "the script sets the environment (environment.env)",
    "get-user-env": "the script sets the environment (environment.env)",
    "mem-per-cpu": "hpctrain has no per-CPU memory key: set slurm.mem (per node) or "
    "slurm.mem_per_gpu",
    "mem-per-gpu": "set slurm.mem_per_gpu",
    "clusters": "a profile describes one cluster; publish a profile per cluster",
    "cluster": "a profile describes one cluster; publish a profile per cluster",
    "uid": "jobs run as the user who submits them",
    "gid": "jobs run as the user who submits them",
    "oversubscribe": "set slurm.exclusive (the site decides sharing)",
    "share": "set slurm.exclusive (the site decides sharing)",
    "env": "set environment.env (a lock on it must hold inside the container too)",
    "env-file": "set environment.env (a lock on it must hold inside the container too)",
}
SBATCH_OWNED.update({k: v for k, v in POLICY_OWNED.items() if k not in ("env", "env-file")})
SRUN_OWNED.update(POLICY_OWNED)
# pyxis options that change the container: they belong with it in environment.container.flags,
# where a lock on the container covers them (in slurm.srun_args they would undo that lock).
PYXIS_FLAGS = {
    k: "put it in environment.container.flags (the container's options, covered by its lock)"
    for k in (
        "container-writable",
        "container-readonly",
        "container-remap-root",
        "no-container-remap-root",
        "container-mount-home",
        "no-container-mount-home",
        "container-save",
        "container-entrypoint",
        "no-container-entrypoint",
        "container-entrypoint-log",
        "container-env",
    )
}
TORCHRUN_OWNED = {
    k: "hpctrain sets the topology and rendezvous from the request and profile"
    for k in (
        "nnodes",
        "nproc-per-node",
        "rdzv-backend",
        "rdzv-endpoint",
        "rdzv-id",
        "rdzv-conf",
        "max-restarts",
        "node-rank",
        "master-addr",
        "master-port",
        "standalone",
        "tee",
        "log-dir",
        "role",
        "run-path",
        "module",
        "no-python",
    )
}
# torchrun's agent checks its workers this often; in-job restarts rely on it (launchers/torchrun.py)
TORCHRUN_OWNED["monitor-interval"] = "hpctrain sets it (a dead worker is noticed within 0.5 s)"
# torchrun options that set what a profile section decides: refused in launch.torchrun_args while
# a lock covers that section, unless the same lock holds launch.torchrun_args (the admin's own).
TORCHRUN_SECTION = {"local-addr": "rendezvous"}
# Environment variables with a dedicated profile key (one source of truth).
DEDICATED_ENV = {
    "NCCL_SOCKET_IFNAME": "network.socket_ifname",
    "GLOO_SOCKET_IFNAME": "network.gloo_socket_ifname",
    "NCCL_IB_DISABLE": "network.ib",
    "NCCL_IB_HCA": "network.ib_hca",
    "NCCL_IB_GID_INDEX": "network.ib_gid_index",
    "NCCL_P2P_LEVEL": "network.p2p_level",
}
# Variables the watchdog section exports (hpctrain/render/script.py): a lock on `watchdog` (or the
# key) covers them wherever an environment mapping would set them (hpctrain/profiles/locks.py).
WATCHDOG_ENV = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "watchdog.nccl_async_error_handling",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "watchdog.nccl_heartbeat_timeout_s",
}
# Variables the rendered script sets itself.
OWNED_ENV_PREFIXES = (jobenv.PREFIX, "SLURM_", "TORCHELASTIC_")
OWNED_ENV = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",  # unset on AMD nodes (ROCR_VISIBLE_DEVICES is the one list); task_env may
}
# Per-task variables may choose the device order (a site's CUDA_VISIBLE_DEVICES permutation).
TASK_ENV_ALLOWED = {"CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"}
NETWORK_ENV_PREFIXES = (
    "NCCL_",
    "FI_",
    "UCX_",
    "TORCH_",
    "GLOO_",
    "CUDA_",
    "OMPI_",
    "PMIX_",
    "MPICH_",
    "CXI_",
    "RCCL_",
    "HSA_",
)


# Variables that change how bash itself, or every program the script starts, behaves: IFS splits
# the script's words, BASH_ENV/ENV run a file in every `bash -c`, LD_PRELOAD/LD_AUDIT load code into
# every process. Refused wherever an env mapping is set (docs/security.md). PATH is allowed (a site
# adds its tools): write it as `/opt/x/bin:$PATH`.
SHELL_ENV = {
    "IFS",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "CDPATH",
    "GLOBIGNORE",
    "PS4",
    "PROMPT_COMMAND",
    "BASH_XTRACEFD",
    "LD_PRELOAD",
    "LD_AUDIT",
    # bash's own switches: POSIX mode, an older bash's rules, `EXECIGNORE='*'` hides every
    # program (srun: command not found), FUNCNEST breaks the script's helpers, TMOUT times out `read`
    "POSIXLY_CORRECT",
    "BASH_COMPAT",
    "EXECIGNORE",
    "FUNCNEST",
    "TMOUT",
    "BASH_LOADABLES_PATH",
}


def env_name(name: str, *, task: bool = False) -> str:
    checks.check_env_name(name)
    inner = shell.inner_name(name)
    if inner != name:  # what the container sees must pass the same checks
        try:
            env_name(inner, task=task)
        except ValueError as e:
            raise ValueError(f"{name} sets {inner} inside the container: {e}") from None
        return name
    if name in SHELL_ENV:
        raise ValueError(
            f"{name} would change how the job script itself runs (docs/security.md); "
            "fix: remove it (set what you need in the program's own config)"
        )
    if name in DEDICATED_ENV:
        raise ValueError(f"{name} has its own key; fix: set {DEDICATED_ENV[name]} instead")
    if task and name in TASK_ENV_ALLOWED:
        return name
    if name in OWNED_ENV or name.startswith(OWNED_ENV_PREFIXES):
        raise ValueError(f"{name} is set by hpctrain's script; fix: remove it")
    return name


def _net_env_name(name: str) -> str:
    env_name(name)
    if not name.startswith(NETWORK_ENV_PREFIXES):
        raise ValueError(
            f"{name} is not a network variable; fix: network.env takes names "
            f"starting with {', '.join(NETWORK_ENV_PREFIXES)}; put other "
            "variables in environment.env"
        )
    return name


def number_as_text(value: object) -> object:
    """Environment values are text; `NCCL_IB_TIMEOUT: 22` means "22" (true/false stay errors:
    the program reading it decides whether that is "1", "true" or "yes")."""
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _without_nulls(value: object) -> object:
    """`NAME: null` in a child profile (or the user config) removes an inherited entry."""
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value


EnvValue = Annotated[str, BeforeValidator(number_as_text), AfterValidator(checks.check_env_value)]
EnvMap = Annotated[
    dict[Annotated[str, AfterValidator(env_name)], EnvValue], BeforeValidator(_without_nulls)
]
TaskEnvMap = Annotated[
    dict[Annotated[str, AfterValidator(lambda n: env_name(n, task=True))], EnvValue],
    BeforeValidator(_without_nulls),
]
NetworkEnvMap = Annotated[
    dict[Annotated[str, AfterValidator(_net_env_name)], EnvValue], BeforeValidator(_without_nulls)
]
SbatchOption = Annotated[
    str, AfterValidator(lambda v: checks.check_option(v, SBATCH_OWNED, "sbatch"))
]
SrunOption = Annotated[
    str, AfterValidator(lambda v: checks.check_option(v, {**PYXIS_FLAGS, **SRUN_OWNED}, "srun"))
]
ContainerFlag = Annotated[
    str, AfterValidator(lambda v: checks.check_option(v, SRUN_OWNED, "container"))
]
TorchrunOption = Annotated[
    str, AfterValidator(lambda v: checks.check_torchrun_option(v, TORCHRUN_OWNED))
]
EnvName = Annotated[str, AfterValidator(env_name)]
