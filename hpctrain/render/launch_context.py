"""The site-specific part of the render context: launcher, container, modules, admin lines,
per-task variables and the rendezvous head. Every value is already shell-safe (`Sh`) or plain data
the template quotes; the template only places them (templates/sbatch.sh.j2, launch blocks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpctrain import containers, launchers
from hpctrain.kernel.rundir import umask_of
from hpctrain.render.shellwords import Sh, quote, shvalue

if TYPE_CHECKING:
    from hpctrain.jobs.request import JobRequest
    from hpctrain.profiles.resolved import ResolvedProfile


def launcher_of(profile: ResolvedProfile) -> Any:
    return launchers.get(profile.launch.launcher)


def tasks_per_node(profile: ResolvedProfile, req: JobRequest) -> int:
    """srun tasks on each node: 1 (torchrun) or one per GPU/worker (srun)."""
    return int(launcher_of(profile).tasks_per_node(req))


def task_cpus(profile: ResolvedProfile, req: JobRequest) -> int | None:
    """`--cpus-per-task` for one srun task, from slurm.cpus_per_gpu / slurm.cpus_per_task."""
    s = profile.slurm
    tasks = tasks_per_node(profile, req)
    per_node = s.cpus_per_gpu * req.gpus if s.cpus_per_gpu else s.cpus_per_task
    if per_node is None:
        return None
    return max(1, per_node // tasks)


def gpu_directive(profile: ResolvedProfile, gpus: int) -> str | None:
    """How the job asks for GPUs (slurm.gpu_request), or None: no GPUs, or `none`, a whole-node
    allocation that asks for no GPUs by name."""
    s = profile.slurm
    if not s.gpus_per_node or not gpus or s.gpu_request == "none":
        return None
    return f"--gres=gpu:{gpus}" if s.gpu_request == "gres" else f"--gpus-per-node={gpus}"


def gpu_vendor(profile: ResolvedProfile) -> str | None:
    return profile.slurm.gpu_vendor if profile.slurm.gpus_per_node else None


def mounts(profile: ResolvedProfile, run_dir: str) -> list[str]:
    """SRC:DST[:OPTS] for the container (a bare path mounted at itself), the run folder last."""
    c = profile.environment.container
    if c is None or c.kind == "edf":
        return []
    out = [m if ":" in m else f"{m}:{m}" for m in c.mounts]
    return [*out, f"{run_dir}:{run_dir}"]


def container_sbatch(profile: ResolvedProfile) -> list[str]:
    c = profile.environment.container
    return containers.get(c.kind).sbatch(c) if c else []


def module_line(line: str) -> Sh:
    """One `environment.modules` entry as arguments of the script's hpctrain_module helper."""
    words = line.split(" ")
    if words[0] not in ("load", "unload", "use", "purge", "reset"):
        words = ["load", *words]
    if words[0] == "use":
        return Sh(" ".join([*words[:1], *(shvalue(w) for w in words[1:])]))
    return Sh(" ".join(quote(w) for w in words))


def conda_env(activate: str | None) -> Sh | None:
    """The word after `conda activate`: a name, or a prefix path (`conda:/x`, `conda:$HOME/x`)."""
    if not activate or not activate.startswith("conda:"):
        return None
    env = activate.removeprefix("conda:")
    if env == "~" or env.startswith("~/"):
        env = "$HOME" + env[1:]
    return shvalue(env) if env.startswith(("/", "$")) else quote(env)


def context(profile: ResolvedProfile, req: JobRequest, run_dir: str) -> dict[str, Any]:
    launcher = launcher_of(profile)
    env, c = profile.environment, profile.environment.container
    kind = containers.get(c.kind) if c else None
    gpu, where = gpu_vendor(profile), mounts(profile, run_dir)
    rdzv = profile.rendezvous
    return {
        "launcher": profile.launch.launcher,
        "tasks_per_node": tasks_per_node(profile, req),
        "step_options": [quote(o) for o in launcher.step_options(profile, req)],
        **launcher.context(profile, req),
        "container_srun": kind.srun_options(c, where, gpu) if kind else [],
        "container_prefix": kind.prefix(c, where, gpu) if kind else [],
        "module_lines": [module_line(m) for m in env.modules],
        "setup_lines": [Sh(line) for line in env.setup],  # trusted admin shell
        "task_setup_lines": [Sh(line) for line in env.task_setup],  # trusted admin shell
        "task_env": [(Sh(k), shvalue(v)) for k, v in sorted(env.task_env.items())],
        "activate_in_task": bool(c and env.activate),
        "conda_env": conda_env(env.activate),
        # slurm.srun_args_if_exists: (the path as a shell word, the options), tested on the node
        "srun_args_if": [
            (shvalue(path), Sh(" ".join(quote(o) for o in opts)))
            for path, opts in profile.slurm.srun_args_if_exists.items()
            if opts
        ],
        "gloo_prefix": profile.network.gloo_prefix,
        "gloo_words": Sh(
            " ".join(shvalue(w) for w in (profile.network.gloo_prefix or "").split(","))
        ),
        "head_suffix": rdzv.host_suffix,
        "head_interface": rdzv.interface,
        "fixed_port": rdzv.port,
        # the job's umask (storage.share): what it writes is never readable beyond the share
        "umask": Sh(f"{umask_of(getattr(profile.storage, 'share', None)):03o}"),
    }
