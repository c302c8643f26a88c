"""The `slurm` and `network` sections: how jobs are requested, how ranks talk."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from hpctrain.kernel import partners
from hpctrain.profiles.schema import checks
from hpctrain.profiles.schema.base import (
    NETWORK_ENV_PREFIXES,
    NetworkEnvMap,
    SbatchOption,
    SrunOption,
    Strict,
    number_as_text,
)

# A GRES type name (gres.conf `Type=`): what sits between `gpu:` and the count in `gpu:A100:4`.
GRES_TYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


class Slurm(Strict):
    """How jobs are requested from Slurm."""

    partition: str | None = Field(
        None, description="Partition (`--partition`); null: the cluster default."
    )
    account: str | None = Field(None, description="Account to charge (`--account`).")
    qos: str | None = Field(None, description="Quality of service (`--qos`).")
    constraint: str | None = Field(
        None, description="Node features (`--constraint`), e.g. `a100&ib` or `gpu`."
    )
    reservation: str | None = Field(None, description="Reservation name (`--reservation`).")
    gpu_request: Literal["gpus-per-node", "gres", "none"] = Field(
        "gpus-per-node",
        description="How GPUs are requested: `gpus-per-node` writes `--gpus-per-node=N`, `gres` "
        "writes `--gres=gpu:N` (the site's choice), `none` writes neither: a whole-node "
        "allocation where every node's GPUs come with the node (`exclusive: true` or a GPU "
        "partition). `--gpus` still says how many workers each node starts.",
    )
    gpus_per_node: int = Field(
        0, ge=0, description="GPUs on each node; one training process per GPU. 0: CPU workers."
    )
    gpus_per_domain: int | None = Field(
        None,
        ge=1,
        description="GPUs joined by the fast link (NVLink/NVSwitch, AMD Infinity Fabric): "
        "tensor parallel stays inside one such domain (`plan` and the submit check of "
        "`parallel.tp`). null: gpus_per_node (the node is the domain). Set it below "
        "gpus_per_node for nodes with two NVLink islands (e.g. 4 of 8); a multi-node domain "
        "(GB200 NVL72: 72) is accepted but tensor parallel still stays inside a node.",
    )
    gpu_type: str | None = Field(
        None,
        description="The GPU type, as the site's Slurm names it (its GRES type: `A100`, `gh200`, "
        "`a100_3g.20gb`): `--gpus-per-node=A100:4` with gpu_request gpus-per-node, "
        "`--gres=gpu:A100:4` with gres. Picks one kind of node in a partition that mixes them "
        "(`submit --gpu-type` overrides it). Null: any GPU the partition has.",
    )
    gpu_vendor: Literal["nvidia", "amd"] = Field(
        "nvidia",
        description="The GPUs' vendor: chooses the container's GPU flag (`--nv` or `--rocm`). Each "
        "node still detects its GPUs itself (nvidia-smi; rocm-smi or /dev/kfd) and "
        "trains with torch's `nccl` backend on either (RCCL on AMD).",
    )
    gpu_mem_gib: float | None = Field(
        None, gt=0, description="Memory of one GPU in GiB (used by `plan`); null: unknown."
    )
    cpus_per_gpu: int | None = Field(
        None,
        ge=1,
        description="CPUs per GPU (`--cpus-per-gpu`); set this or cpus_per_task, not both.",
    )
    cpus_per_task: int | None = Field(
        None,
        ge=1,
        description="CPUs per node task (`--cpus-per-task`; with `launch.launcher: srun` "
        "it is divided among the node's GPU tasks).",
    )
    mem: str | None = Field(
        None,
        description='Memory per node (`--mem`): "0" means all of it, or e.g. "480G", "128GB" '
        "(what Slurm takes: a number with K, M, G or T, optionally B); null: the cluster default.",
    )
    mem_per_gpu: str | None = Field(
        None,
        description="Memory per allocated GPU (`--mem-per-gpu`), same sizes as mem; set this or "
        "mem, not both (Slurm refuses both).",
    )
    default_time_min: int = Field(
        60, ge=1, description="Time limit in minutes when `--time` is not given."
    )
    max_time_min: int | None = Field(
        None, ge=1, description="Largest time limit a request may ask for; null: no limit."
    )
    max_nodes: int | None = Field(
        None, ge=1, description="Largest node count a request may ask for."
    )
    exclusive: bool = Field(False, description="Request whole nodes (`--exclusive`).")
    extra_sbatch: list[SbatchOption] = Field(
        default_factory=list,
        description="Extra `#SBATCH` directives, each `--key` or `--key=value`. Directives hpctrain "
        "writes itself (--nodes, --ntasks*, --gpus*, --gres, --tres-per-task, --signal, --requeue, "
        "--output, --open-mode, --job-name, --time, ...) and those with their own key are refused "
        "(`--tres-per-task=gres/gpu:1` too, as `--gpus-per-task`: one GPU request per job).",
    )
    single_node_sbatch: list[SbatchOption] = Field(
        default_factory=list,
        description="`#SBATCH` directives written only for single-node jobs (a Slingshot site's "
        "`--network=single_node_vni`), same rules as extra_sbatch.",
    )
    srun_args: list[SrunOption] = Field(
        default_factory=list,
        description="Extra `srun` options for the launch (e.g. `--cpu-bind=none`), same rules as "
        "extra_sbatch; the container options have their own keys.",
    )

    srun_args_if_exists: dict[str, list[SrunOption]] = Field(
        default_factory=dict,
        description="`PATH: [options]`: extra `srun` options for the launch only when PATH exists "
        "on the job's first node when it starts (a managed cluster's `--auto-resume=1` when "
        "`/opt/sagemaker_cluster` exists); same rules as srun_args, PATH may use $VAR. An "
        "`#SBATCH` directive cannot depend on a node: sbatch reads it before any node is chosen.",
    )

    @field_validator("srun_args_if_exists")
    @classmethod
    def _if_exists(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for path in v:
            checks.check_path_text(path, "srun_args_if_exists path")
            if not path.startswith(("/", "$")):
                raise ValueError(
                    f"srun_args_if_exists path {path!r} is relative; fix: an absolute path "
                    "(or $VAR/...) as the node sees it"
                )
        return v

    @field_validator("partition", "account", "qos", "reservation")
    @classmethod
    def _word(cls, v: str | None) -> str | None:
        if v is not None and not checks.SLURM_WORD.match(v):
            raise ValueError(f"{v!r} is not a Slurm name; fix: use letters, digits and _.,:+- only")
        return v

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type(cls, v: str | None) -> str | None:
        if v is not None and not GRES_TYPE.match(v):
            raise ValueError(
                f"{v!r} is not a Slurm GPU type; fix: the type as `sinfo -o %G` shows it after "
                "`gpu:` (e.g. A100, gh200, a100_3g.20gb): letters, digits and _.- only"
            )
        return v

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, v: str | None) -> str | None:
        if v is not None and not checks.CONSTRAINT.match(v):
            raise ValueError(
                f"{v!r} is not a Slurm constraint; fix: use feature names joined "
                "with & | , and brackets, no spaces"
            )
        return v

    @field_validator("mem", "mem_per_gpu", "gpu_type", mode="before")
    @classmethod
    def _mem_number(cls, v: object) -> object:
        return number_as_text(v)

    @field_validator("mem", "mem_per_gpu")
    @classmethod
    def _mem(cls, v: str | None) -> str | None:
        if v is not None and not checks.MEM.match(v):
            raise ValueError(
                f'{v!r} is not a Slurm memory size; fix: write e.g. "480G", "128GB", '
                '"512000M" or "0" (all memory of the node)'
            )
        return v

    def _checks(self) -> list[tuple[str, str]]:
        out = []
        if self.cpus_per_gpu is not None and self.cpus_per_task is not None:
            out.append(
                (
                    "cpus_per_task",
                    "cpus_per_gpu and cpus_per_task are both set; "
                    "fix: keep one of them (set the other to null)",
                )
            )
        if self.cpus_per_gpu is not None and self.gpus_per_node == 0:
            out.append(
                (
                    "cpus_per_gpu",
                    "cpus_per_gpu is set but gpus_per_node is 0; "
                    "fix: use cpus_per_task for CPU-only nodes",
                )
            )
        d, g = self.gpus_per_domain, self.gpus_per_node
        if d is not None and g and g % d and d % g:
            out.append(
                (
                    "gpus_per_domain",
                    f"gpus_per_domain {d} and gpus_per_node {g}: one must divide the other; "
                    f"fix: a divisor of {g} (NVLink islands inside a node) or a multiple of it",
                )
            )
        if self.mem is not None and self.mem_per_gpu is not None:
            out.append(
                (
                    "mem_per_gpu",
                    "mem and mem_per_gpu are both set (Slurm takes one of --mem, --mem-per-gpu); "
                    "fix: keep one of them (set the other to null)",
                )
            )
        if self.mem_per_gpu is not None and self.gpus_per_node == 0:
            out.append(
                (
                    "mem_per_gpu",
                    "mem_per_gpu is set but gpus_per_node is 0; fix: use mem for CPU-only nodes",
                )
            )
        if self.gpu_type is not None and (self.gpu_request == "none" or not g):
            out.append(
                (
                    "gpu_type",
                    f"gpu_type {self.gpu_type} names the GPUs of a request, but "
                    + (
                        "gpu_request is none (no GPUs are asked for by name)"
                        if g
                        else "gpus_per_node is 0"
                    )
                    + "; fix: use gpu_request gpus-per-node or gres, or remove gpu_type "
                    "(or pick the nodes with slurm.constraint)",
                )
            )
        if self.max_time_min is not None and self.default_time_min > self.max_time_min:
            out.append(
                (
                    "default_time_min",
                    f"default_time_min {self.default_time_min} is above "
                    f"max_time_min {self.max_time_min}; fix: lower default_time_min or raise "
                    "max_time_min",
                )
            )
        return out


class Network(Strict):
    """How the ranks talk to each other (NCCL on GPUs, gloo on CPUs)."""

    socket_ifname: str | None = Field(
        None,
        description="NCCL_SOCKET_IFNAME, in NCCL's syntax: `eth` (prefix), `=eth0` (exact), "
        "`ib0,ib1` (list), `^docker,lo` (exclude), `^=docker0`. Null: NCCL chooses.",
    )
    gloo_socket_ifname: str | None = Field(
        None,
        description="GLOO_SOCKET_IFNAME: exact interface names, comma separated. Null: taken from "
        "socket_ifname: an exact name (`=eth0`) as it is, a prefix (`hsn`, `bond`) "
        "resolved inside each task to the node's first interface with that prefix; "
        "left unset when socket_ifname excludes (`^`).",
    )
    ib: bool | Literal["unset"] = Field(
        False,
        description="Use InfiniBand/RoCE verbs: true sets NCCL_IB_DISABLE=0, false sets "
        "NCCL_IB_DISABLE=1, `unset` exports neither (the site's NCCL module or plugin chooses "
        "the transport).",
    )
    ib_hca: str | None = Field(
        None, description="NCCL_IB_HCA, e.g. `mlx5_0:1,mlx5_1:1` or `^mlx5_2`; needs ib: true."
    )
    ib_gid_index: int | None = Field(
        None, ge=0, le=255, description="NCCL_IB_GID_INDEX (RoCE v2 is usually 3); needs ib: true."
    )
    p2p_level: Literal["LOC", "NVL", "PIX", "PXB", "PHB", "SYS"] | None = Field(
        None, description="NCCL_P2P_LEVEL: how far apart two GPUs may be for peer-to-peer."
    )
    racks: dict[str, str] = Field(
        default_factory=dict,
        description='Rack name -> its nodes as a Slurm hostlist, e.g. `{r1: "gpu[001-064]", r2: '
        '"gpu[065-128]"}`: a rank\'s in-memory snapshot copy goes to a node of another rack '
        "(a rack lost at once keeps its ranks' copies). Empty: the node half the job away.",
    )
    env: NetworkEnvMap = Field(
        default_factory=dict,
        description="Extra network environment, names starting with "
        + ", ".join(f"`{p}`" for p in NETWORK_ENV_PREFIXES)
        + " (e.g. NCCL_IB_TC, FI_PROVIDER). Variables with their own key are refused; "
        "values follow the environment value grammar; `NAME: null` removes an "
        "inherited entry.",
    )

    @field_validator("ib", mode="before")
    @classmethod
    def _ib(cls, v: object) -> object:
        if isinstance(v, bool) or v == "unset":
            return v
        raise ValueError(
            f"{v!r} is not true, false or unset; fix: true (NCCL_IB_DISABLE=0), false "
            "(NCCL_IB_DISABLE=1) or unset (the site's NCCL chooses)"
        )

    @field_validator("socket_ifname")
    @classmethod
    def _nccl_if(cls, v: str | None) -> str | None:
        return None if v is None else checks.check_nccl_ifname(v)

    @field_validator("gloo_socket_ifname")
    @classmethod
    def _gloo_if(cls, v: str | None) -> str | None:
        return None if v is None else checks.check_gloo_ifname(v)

    @field_validator("racks")
    @classmethod
    def _racks(cls, v: dict[str, str]) -> dict[str, str]:
        problems = partners.parse_racks(v)
        if problems:
            raise ValueError(
                "; ".join(problems) + "; fix: give each rack its own nodes as a Slurm hostlist"
            )
        return v

    @field_validator("ib_hca")
    @classmethod
    def _hca(cls, v: str | None) -> str | None:
        return None if v is None else checks.check_ib_hca(v)

    def _checks(self) -> list[tuple[str, str]]:
        out = []
        if self.ib is False and self.ib_hca is not None:
            out.append(
                ("ib_hca", "ib_hca is set but ib is false; fix: set ib: true or remove ib_hca")
            )
        if self.ib is False and self.ib_gid_index is not None:
            out.append(
                (
                    "ib_gid_index",
                    "ib_gid_index is set but ib is false; fix: set ib: true or remove ib_gid_index",
                )
            )
        return out

    @property
    def gloo_ifname(self) -> str | None:
        """The exact GLOO_SOCKET_IFNAME to export, or None (see gloo_prefix)."""
        if self.gloo_socket_ifname is not None:
            return self.gloo_socket_ifname
        v = self.socket_ifname
        if v is None or not v.startswith("="):
            return None
        return v.removeprefix("=")

    @property
    def gloo_prefix(self) -> str | None:
        """Interface names/prefixes each task resolves to real names for GLOO_SOCKET_IFNAME."""
        if self.gloo_socket_ifname is not None:
            return None
        v = self.socket_ifname
        if v is None or v.startswith(("^", "=")):
            return None
        return v
