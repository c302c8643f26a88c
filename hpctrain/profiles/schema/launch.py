"""The `launch`, `rendezvous`, `storage` and `preemption` sections."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from hpctrain.kernel import jobenv, shell
from hpctrain.kernel.plugins import LAUNCHERS
from hpctrain.profiles.schema import checks
from hpctrain.profiles.schema.base import Strict, TorchrunOption

DEFAULT_PORT = 29500  # torch's default: never chosen from a range, only when asked for by name


class Launch(Strict):
    """How the training processes start on the nodes (one module per launcher: hpctrain/launchers/)."""

    launcher: Literal[tuple(LAUNCHERS)] = Field(  # type: ignore[valid-type]
        "torchrun",
        description="`torchrun`: one srun task per node runs torchrun, which starts one worker per "
        "GPU (c10d rendezvous). `srun`: one srun task per GPU is the worker; RANK, "
        "LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set "
        "in each task from SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS and the rendezvous "
        "head (torch's env:// init, no torchrun agent).",
    )
    torchrun: str | None = Field(
        None,
        description="The torchrun command, words separated by spaces: `torchrun`, `python -m "
        "torch.distributed.run`, or a site wrapper taking the same flags (`torchrun_jsc`). "
        "It is given `--rdzv-backend=hpctrain` (c10d with its state signed by the job key), "
        "which torch finds through hpctrain's `torchrun.handlers` entry point: hpctrain must be "
        "installed in that torchrun's Python. Null: the node Python with "
        "`-m hpctrain.launchers.rdzv` (torchrun with that backend registered).",
    )
    torchrun_args: list[TorchrunOption] = Field(
        default_factory=list,
        description="Extra torchrun options, e.g. `--numa-binding=exclusive`, `--local-addr=$HOSTNAME`"
        " (the topology, rendezvous and `--monitor-interval` options are hpctrain's; `--local-addr` "
        "is refused while `rendezvous` is locked, unless the lock holds launch.torchrun_args too).",
    )
    python: str | None = Field(
        None,
        description="The Python on the nodes (a module's `python3`, the container's `/usr/bin/python`, "
        f"a path with $VAR). Null: ${jobenv.PYTHON} when set, else `python` when a venv, "
        "conda env or container is activated, else the submitting interpreter.",
    )
    task_gpus: Literal["gpus-per-task", "gpu-bind", "none"] = Field(
        "none",
        description="launcher srun: how each task gets its GPU. `gpus-per-task`: `srun "
        "--gpus-per-task=1`; `gpu-bind`: `srun --gpu-bind=single:1`, one of the GPUs the job holds "
        "(a `--gres` site); `none` (default, as under torchrun): every GPU of the node stays "
        "visible to each task and LOCAL_RANK picks one, which unchanged scripts expect "
        "(`cuda:$LOCAL_RANK`); or choose with environment.task_env.",
    )

    @field_validator("torchrun")
    @classmethod
    def _torchrun(cls, v: str | None) -> str | None:
        if v is None:
            return v
        words = v.split(" ")
        checks.check_word(words[0], "launch.torchrun command")
        for w in words:
            checks.check_defaults(w, "launch.torchrun", word=True)
            if not w or not checks.WORD.match(shell.ENV_REF.sub("x", w)):
                raise ValueError(
                    f"launch.torchrun {v!r}: {w!r} is not a plain word; fix: words of "
                    "letters, digits, _./+=:@,%- and $VAR separated by single spaces"
                )
        return v

    @field_validator("python")
    @classmethod
    def _python(cls, v: str | None) -> str | None:
        return None if v is None else checks.check_word(v, "launch.python")


class Storage(Strict):
    """Where run folders live."""

    runs_dir: str | None = Field(
        None,
        description="Folder holding run folders, on a filesystem every node sees (e.g. "
        "`$SCRATCH/hpctrain`; $VAR and ~ are expanded when you submit, so the variable "
        "must be set there). Null: `./runs` in the directory of `submit`. Always made "
        "absolute at submit time.",
    )
    share: Literal["none", "group"] = Field(
        "none",
        description="Who else may read a run folder. `none` (default): the run folder is 0700 and "
        "the job runs under `umask 077`, so checkpoints, logs and exports are yours alone; `group`: "
        "0750 and `umask 027`, your group reads them and never writes. Never world-readable. A "
        "runs_dir hpctrain creates gets the same mode; one that exists is left as it is (a "
        "group-writable one needs the sticky bit, `chmod +t`, or members can swap run folders: "
        "`resume` and `status` refuse a run folder, run.yaml or job.sh another account could "
        "have written).",
    )

    @field_validator("runs_dir")
    @classmethod
    def _dir(cls, v: str | None) -> str | None:
        return None if v is None else checks.check_path_text(v, "runs_dir")


class Rendezvous(Strict):
    """The rendezvous head and port: `port_min + job_id % (port_max - port_min)`, or a fixed port."""

    port_min: int = Field(20000, description="Lowest port (above 1024, below the ephemeral range).")
    port_max: int = Field(32000, description="Highest port (at most 65535; exclusive).")
    port: int | None = Field(
        None,
        description="A fixed port instead of the range (any, including 29500 when the site "
        "asks for it by name); null: the range.",
    )
    host_suffix: str = Field(
        "",
        description="Appended to the first node's name before it is resolved: `i` reaches "
        "`jwb0001i`, the InfiniBand name of a JSC node.",
    )
    interface: str | None = Field(
        None,
        description="Use the IPv4 address of this interface of the first node (e.g. `ib0`, "
        "`hsn0`) instead of resolving its name (getent ahostsv4).",
    )

    @field_validator("host_suffix")
    @classmethod
    def _suffix(cls, v: str) -> str:
        if v and not re.match(r"^[A-Za-z0-9.-]{1,32}\Z", v):
            raise ValueError(
                f"{v!r} is not a hostname suffix; fix: letters, digits, . and -, e.g. 'i'"
            )
        return v

    @field_validator("interface")
    @classmethod
    def _iface(cls, v: str | None) -> str | None:
        if v is not None and not checks.IFACE.match(v):
            raise ValueError(f"{v!r} is not an interface name; fix: an exact name such as ib0")
        return v

    def _checks(self) -> list[tuple[str, str]]:
        out = []
        if self.port is not None and not 1024 < self.port <= 65535:
            out.append(("port", f"port {self.port} is not valid; fix: 1024 < port <= 65535"))
        if not 1024 < self.port_min < self.port_max <= 65535:
            out.append(
                (
                    "port_min",
                    f"port range {self.port_min}-{self.port_max} is not valid; fix: "
                    "choose 1024 < port_min < port_max <= 65535, outside the ephemeral range "
                    "(/proc/sys/net/ipv4/ip_local_port_range), e.g. 20000-32000",
                )
            )
        elif (
            self.port is None
            and self.port_max - self.port_min == 1
            and self.port_min == DEFAULT_PORT
        ):
            out.append(
                (
                    "port_min",
                    f"the range {self.port_min}-{self.port_max} holds only "
                    f"{DEFAULT_PORT}, which a range never picks (every default torchrun uses it); "
                    f"fix: write `port: {DEFAULT_PORT}` to use it on purpose, or widen the range",
                )
            )
        if self.host_suffix and self.interface:
            out.append(("interface", "host_suffix and interface are both set; fix: keep one"))
        return out


class Preemption(Strict):
    """How a job is warned before it is stopped, and what happens next."""

    signal: Literal["USR2", "USR1", "HUP", "INT", "URG", "TERM"] = Field(
        "USR2",
        description="Signal sent to the batch shell `warning_s` seconds before the end "
        "(`--signal=B:SIG@warning_s`). USR1 is accepted but NCCL may catch it; prefer USR2. "
        "`TERM`: the site preempts with SIGTERM and a grace time, no warning signal (NCSA "
        "Delta's preempt partitions: SIGTERM, SIGKILL 300 s later; Slurm's `PreemptMode=REQUEUE` "
        "with `GraceTime`): a TERM, to the batch shell or to the tasks, is a preemption, the run "
        "saves and is requeued; `hpctrain cancel` still ends it CANCELLED (it marks the run "
        "first), a plain `scancel` too (Slurm no longer runs the job: no requeue). Under "
        "launcher torchrun the save must fit torchrun's 30 s between its TERM and KILL to the "
        "workers. Otherwise TERM means cancel.",
    )
    warning_s: int = Field(
        120, ge=0, le=65535, description="Seconds of warning before the time limit."
    )
    requeue: bool = Field(True, description="Requeue the job after a preemption (`--requeue`).")
    max_restarts: int = Field(10, ge=0, description="Stop requeueing after this many restarts.")
    max_in_job_restarts: int = Field(
        2,
        ge=0,
        le=100,
        description="A worker that dies, stalls (watchdog.stall_s) or times out in a collective "
        "(watchdog.pg_timeout_s): every node's workers stop and training starts again inside the "
        "same allocation from the newest verified checkpoint, up to this many times per job start "
        "(torchrun: `--max-restarts`; launcher srun: a new srun step). Then the usual path: a stall "
        "requeues (max_restarts), a dead worker fails the job. An error that would repeat (an "
        "exception in the training code, a bad config, a checkpoint that does not load) is never "
        "retried: the job fails at once with its cause. 0: no in-job restart.",
    )
    spare_nodes: int = Field(
        0,
        ge=0,
        le=64,
        description="Hot spares (Slurm only; `submit --spare-nodes` overrides it): the allocation "
        "holds this many nodes more than training uses. A node the preflight gate finds bad at the "
        "start, or one whose failure ended a training step and that the gate then confirms bad, is "
        "swapped for a spare and training starts again in the same job, on the new node list "
        "(no requeue, no queue wait; a `spare_swapped` event, and `status` names the node out and "
        "the spares left). With no good spare left, the gate's usual path applies "
        "(preflight.on_fail: shrink, or exclude + requeue). 0: no spares.",
    )

    @field_validator("signal", mode="before")
    @classmethod
    def _sig(cls, v: object) -> object:
        if not isinstance(v, str):
            return v
        v = v.upper().removeprefix("SIG")
        if v in ("KILL", "STOP", "CONT"):
            raise ValueError(
                f"{v} cannot be the preemption warning: Slurm sends KILL to end a job (it "
                "cannot be caught), and STOP/CONT suspend it; fix: use USR2 (the default), or "
                "TERM where the site preempts with SIGTERM and a grace time"
            )
        return v
