"""The batch shell's environment, as the script sets it up: the module lines, the activation, the
exports (watchdog, derived, network, the profile's own) and, before each profile value that names a
variable, its `hpctrain_need` guard (hpctrain/jobs/envrefs.py); the per-task variables and lines."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.jobs import envrefs
from hpctrain.kernel.rundir import umask_of
from hpctrain.kernel.shell import Sh, quote, shvalue
from hpctrain.kernel.values import frozen

if TYPE_CHECKING:
    from collections.abc import Mapping

    from hpctrain.profiles.resolved import ResolvedProfile

MODULE_OPS = ("load", "unload", "use", "purge", "reset")


@frozen
class Export:
    name: str
    value: str
    key: str
    """The profile key that sets it (the messages name it)."""
    guard: Sh
    """`hpctrain_need WHERE NAME...; ` for the variables the value needs from the node, or ""."""


@frozen
class Module:
    words: Sh
    """The arguments of the script's hpctrain_module helper (`load cuda/12.4`)."""
    guard: Sh


@frozen
class Setup:
    """What the batch shell (and each task) runs before the launch, every word shell-safe."""

    modules: tuple[Module, ...]
    lines: tuple[Sh, ...]
    """environment.setup: the site admin's own lines (trusted profile content), run as written."""
    activate_path: str
    """environment.activate with `~` as $HOME ("" without one)."""
    activate_guard: Sh
    conda_env: Sh | None
    """The word after `conda activate` (an activate of `conda:NAME`), else None."""
    activate_in_task: bool
    """Activated inside each task (in the container), not in the batch shell."""
    exports: tuple[Export, ...]
    late_guards: tuple[Sh, ...]
    """Guards of the values the script expands after every export (node python, container)."""
    task_env: tuple[tuple[Sh, Sh], ...]
    task_lines: tuple[Sh, ...]
    umask: Sh
    """The job's umask (storage.share): what it writes is never readable beyond the share."""


def setup(profile: ResolvedProfile, omp_threads: int | None) -> Setup:
    env, origins = profile.environment, _origins(profile)
    done = exports(profile, omp_threads)
    activate = home(env.activate or "")
    return Setup(
        modules=tuple(
            Module(module_words(m), envrefs.guard("environment.modules", m, origins))
            for m in env.modules
        ),
        lines=tuple(Sh(line) for line in env.setup),
        activate_path=activate,
        activate_guard=envrefs.guard("environment.activate", activate, origins),
        conda_env=conda_env(env.activate),
        activate_in_task=bool(env.container and env.activate),
        exports=done,
        late_guards=late_guards(profile, [e.name for e in done]),
        task_env=tuple((Sh(k), shvalue(v)) for k, v in sorted(env.task_env.items())),
        task_lines=tuple(Sh(line) for line in env.task_setup),
        umask=Sh(f"{umask_of(getattr(profile.storage, 'share', None)):03o}"),
    )


def exports(profile: ResolvedProfile, omp_threads: int | None = None) -> tuple[Export, ...]:
    """Every export in the order the script sets them: by name, a value after the exports it
    names (hpctrain/jobs/envrefs.py). Profile values win over derived ones (`omp_threads`: the
    derived OMP_NUM_THREADS of a job; the profile's own wins)."""
    env, keys = _values(profile, omp_threads)
    origins = _origins(profile)
    ordered = envrefs.order(env, keys, origins)
    names = [name for name, _ in ordered]
    out = []
    for i, (name, value) in enumerate(ordered):
        key = keys.get(name, name)  # a derived network value is named by its variable
        out.append(Export(name, value, key, envrefs.guard(key, value, origins, names[:i])))
    return tuple(out)


def environment_vars(profile: ResolvedProfile) -> list[tuple[str, str]]:
    """The network and site environment of a job of this profile, (name, value) in order."""
    return [(e.name, e.value) for e in exports(profile)]


def _values(
    profile: ResolvedProfile, omp_threads: int | None
) -> tuple[dict[str, str], dict[str, str]]:
    """The exports by name, and for each name the profile key it comes from."""
    net, wd = profile.network, profile.watchdog
    # a dead peer fails the job in minutes (watchdog: keys), not after torch's default half hour
    env = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": str(wd.nccl_async_error_handling),
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(wd.nccl_heartbeat_timeout_s),
    }
    keys = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "watchdog.nccl_async_error_handling",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "watchdog.nccl_heartbeat_timeout_s",
    }
    if omp_threads is not None:
        env["OMP_NUM_THREADS"] = str(omp_threads)
        keys["OMP_NUM_THREADS"] = "slurm.cpus_per_task"
    derived = {
        "NCCL_SOCKET_IFNAME": net.socket_ifname,
        "GLOO_SOCKET_IFNAME": net.gloo_ifname,
        # `unset`: the site's NCCL module or plugin chooses the transport
        "NCCL_IB_DISABLE": None if net.ib == "unset" else "0" if net.ib else "1",
        "NCCL_IB_HCA": net.ib_hca,
        "NCCL_IB_GID_INDEX": None if net.ib_gid_index is None else str(net.ib_gid_index),
        "NCCL_P2P_LEVEL": net.p2p_level,
    }
    env |= {name: value for name, value in derived.items() if value}
    for section, values in (("network", net.env), ("environment", profile.environment.env)):
        for k, v in (values or {}).items():
            env[str(k)] = str(v)
            keys[str(k)] = f"{section}.env.{k}"
    return env, keys


def late_guards(profile: ResolvedProfile, exported: list[str]) -> tuple[Sh, ...]:
    """The guards of the node python and the container, after every export."""
    origins, c = _origins(profile), profile.environment.container
    late = []
    if profile.launch.python:
        late.append(envrefs.guard("launch.python", profile.launch.python, origins, exported))
    if c is not None:
        for field in ("image", "mounts", "workdir", "binary"):
            value = getattr(c, field)
            for v in value if isinstance(value, list) else [value] if value else []:
                late.append(envrefs.guard(f"environment.container.{field}", v, origins, exported))
    return tuple(g for g in late if g)


def module_words(line: str) -> Sh:
    """One `environment.modules` entry as arguments of the script's hpctrain_module helper."""
    words = line.split(" ")
    if words[0] not in MODULE_OPS:
        words = ["load", *words]
    if words[0] == "use":
        return Sh(" ".join([*words[:1], *(shvalue(w) for w in words[1:])]))
    return Sh(" ".join(quote(w) for w in words))


def conda_env(activate: str | None) -> Sh | None:
    """The word after `conda activate`: a name, or a prefix path (`conda:/x`, `conda:$HOME/x`)."""
    if not activate or not activate.startswith("conda:"):
        return None
    env = home(activate.removeprefix("conda:"))
    return shvalue(env) if env.startswith(("/", "$")) else quote(env)


def home(path: str) -> str:
    """`~/x` as `$HOME/x`, which shvalue lets expand on the node."""
    return "$HOME" + path[1:] if path == "~" or path.startswith("~/") else path


def _origins(profile: ResolvedProfile) -> Mapping[str, str]:
    return dict(getattr(profile, "origins", None) or {})
