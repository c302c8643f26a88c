"""Profile + request -> the batch script text.

Sandboxed Jinja (templates come from shared site directories) with StrictUndefined, and every `{{ }}`
value shell-quoted by a finalize hook unless it is `Sh` (already safe: built by one of the filters
below). Jinja comments are `{## ... ##}` (bash's `${#x}` would open a default one). The template
search path is site first (the SITE_PATH dirs' templates/, see kernel/jobenv.py; then the user's
config dir), the bundled template last; the bundled one is also reachable as "hpctrain/sbatch.sh.j2" so a
site template can `{% extends "hpctrain/sbatch.sh.j2" %}` and override one block (`{{ super() | safe }}` keeps the
original: like every value, super() is quoted otherwise).

Rendering is deterministic: directives in a fixed order, environment sorted by name (a value after
the exports it names), absolute run folder.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain import __version__
from hpctrain.jobs.request import JobRequest
from hpctrain.kernel import exitcodes, jobenv
from hpctrain.kernel.errors import UserError, ValidationError
from hpctrain.kernel.resources import bundled
from hpctrain.profiles.schema.checks import DIRECTIVE
from hpctrain.render import envrefs, launch_context, templating
from hpctrain.render.shellwords import Sh, in_single_quotes, shvalue

if TYPE_CHECKING:
    from hpctrain.profiles.resolved import ResolvedProfile

TEMPLATE = "sbatch.sh.j2"
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# What a #SBATCH line can carry: the one pattern the profile schema validates with (what validates
# renders). sbatch reads these lines itself; a newline would end the comment and start a command.
DIRECTIVE_RE = DIRECTIVE
# Directives that hpctrain owns (one source of truth); a profile's extra_sbatch may not set them.
OWNED_DIRECTIVES = (
    "--job-name",
    "--nodes",
    "--ntasks",
    "--ntasks-per-node",
    "--gpus",
    "--gpus-per-node",
    "--gres",
    "--cpus-per-task",
    "--cpus-per-gpu",
    "--time",
    "--output",
    "--error",
    "--open-mode",
    "--requeue",
    "--no-requeue",
    "--signal",
    "--array",
)


def _finalize(value: Any) -> str:  # Any: any YAML value of a profile
    if isinstance(value, Sh):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        raise UserError(
            "internal: the template interpolates a value that is not set (None); "
            "guard it with {% if ... %}"
        )
    return shlex.quote(str(value))


def _shjoin(values: Any) -> Sh:  # Any: any YAML value of a profile
    return Sh(" ".join(shlex.quote(str(v)) for v in values))


def _directive(value: str) -> Sh:
    if not DIRECTIVE_RE.match(str(value)):
        raise UserError(
            f"cannot put {value!r} on an #SBATCH line: a directive is --key or --key=value "
            "with no spaces, quotes, newlines or shell characters"
        )
    return Sh(value)


def _envname(name: str) -> Sh:
    if not ENV_NAME_RE.match(str(name)):
        raise UserError(f"{name!r} is not an environment variable name (letters, digits, _)")
    return Sh(name)


_shvalue = shvalue  # the value grammar's quoting (hpctrain/render/shellwords.py)


def _prequoted(values: Any) -> Sh:  # Any: any YAML value of a profile
    """Words hpctrain quoted itself (launcher and container parts of the context), joined."""
    return Sh(" ".join(str(v) for v in values))


# The job environment's names for the template ({{ var.RUN_DIR }}): hpctrain/kernel/jobenv.py.
_VAR = {key: Sh(name) for key, name in jobenv.template_names().items()}
# The exit codes the script reports ({{ exit.PREEMPTED }}): hpctrain/kernel/exitcodes.py.
_EXIT = {
    "PREEMPTED": exitcodes.PREEMPTED,
    "TIMEOUT": exitcodes.TIMEOUT,
    "TERMINATED": exitcodes.TERMINATED,
}


def _home(path: str) -> str:
    """`~/x` as `$HOME/x`, which shvalue lets expand on the node."""
    return "$HOME" + path[1:] if path == "~" or path.startswith("~/") else path


def _template_dirs() -> list[Path]:
    dirs = [
        Path(p) / "templates" for p in (jobenv.get(jobenv.SITE_PATH) or "").split(os.pathsep) if p
    ]
    config = (
        Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        / "hpctrain"
        / "templates"
    )
    dirs.append(config)
    return [d for d in dirs if d.is_dir()]


def environment() -> Any:
    """The sandboxed Jinja environment (hpctrain/render/templating.py: trust, plain data, limits)."""
    return templating.environment(
        _template_dirs(),
        bundled("templates"),
        finalize=_finalize,
        filters={
            "safe": Sh,
            "shjoin": _shjoin,
            "directive": _directive,
            "envname": _envname,
            "shvalue": _shvalue,
            "sq": in_single_quotes,
            "shwords": _prequoted,
        },
    )


def node_python(profile: ResolvedProfile) -> str:
    """The Python the nodes run: the profile's launch.python; the PYTHON override (kernel/jobenv.py)
    if set; `python` from the activated venv/conda env or the container; else this interpreter (the
    submit host and the nodes share the filesystem)."""
    if profile.launch.python:
        return str(profile.launch.python)
    override = jobenv.get(jobenv.PYTHON)
    if override:
        return override
    if profile.environment.activate or profile.environment.container:
        return "python"
    return sys.executable


def cpus_per_task(profile: ResolvedProfile, req: JobRequest) -> int | None:
    return launch_context.task_cpus(profile, req)


def node_directives(profile: ResolvedProfile, req: JobRequest) -> list[str]:
    """#SBATCH --nodes (and --ntasks-per-node): the training nodes plus the hot spares
    (preemption.spare_nodes), which the allocation holds and the training steps leave out."""
    spares = req.spares(profile)
    if req.node_range:
        # a range: no --ntasks-per-node, with which Slurm counts min x tasks and gives the minimum;
        # the srun steps inside give their own --ntasks-per-node
        return [f"--nodes={(req.min_nodes or req.nodes) + spares}-{req.nodes + spares}"]
    tasks = launch_context.tasks_per_node(profile, req)
    return [f"--nodes={req.nodes + spares}", f"--ntasks-per-node={tasks}"]


def sbatch_directives(profile: ResolvedProfile, req: JobRequest, run_dir: str) -> list[str]:
    """Every #SBATCH line, in a fixed order, from the request (topology) and the profile."""
    s, pre = profile.slurm, profile.preemption
    d = [f"--job-name={req.name}", *node_directives(profile, req)]
    gpu = launch_context.gpu_directive(profile, req.gpus)
    if gpu:
        d.append(gpu)
    cpus = cpus_per_task(profile, req)
    if cpus:
        d.append(f"--cpus-per-task={cpus}")
    if s.mem is not None:
        d.append(f"--mem={s.mem}")
    if s.mem_per_gpu is not None:
        d.append(f"--mem-per-gpu={s.mem_per_gpu}")
    d.append(f"--time={req.time_min}")
    for key in ("partition", "account", "qos", "constraint", "reservation"):
        value = getattr(s, key)
        if value:
            d.append(f"--{key}={value}")
    if s.exclusive:
        d.append("--exclusive")
    if req.exclude:
        d.append(f"--exclude={','.join(req.exclude)}")
    d += [
        f"--output={run_dir}/logs/batch.log",
        "--open-mode=append",
        "--requeue" if pre.requeue else "--no-requeue",
        f"--signal=B:{pre.signal}@{pre.warning_s}",
    ]
    for extra in s.extra_sbatch:
        key = extra.split("=", 1)[0]
        if key in OWNED_DIRECTIVES:
            raise UserError(
                f"profile {profile.name}: slurm.extra_sbatch sets {key}, which hpctrain derives "
                "from the request and profile; remove it (use --nodes/--gpus/--time or the "
                "profile's own key)"
            )
        d.append(extra)
    if req.allocated(profile) == 1:
        d += list(s.single_node_sbatch)
    return d + launch_context.container_sbatch(profile)


def environment_vars(
    profile: ResolvedProfile, omp_threads: int | None = None
) -> list[tuple[str, str]]:
    """Network and site environment: (name, value) in the order the script exports them (by name,
    a value after the exports it names: hpctrain/render/envrefs.py). Profile values win over derived ones
    (`omp_threads`: the derived OMP_NUM_THREADS of a job; the profile's own wins)."""
    return list(_environment(profile, omp_threads)[0])


def _environment(
    profile: ResolvedProfile, omp_threads: int | None = None
) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The ordered exports and, for each name, the profile key it comes from."""
    net = profile.network
    wd = profile.watchdog
    # a dead peer fails the job in minutes (watchdog: keys), not after torch's default half hour
    env: dict[str, str] = {
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
    if net.socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = net.socket_ifname
    gloo = net.gloo_ifname
    if gloo:
        env["GLOO_SOCKET_IFNAME"] = gloo
    if net.ib != "unset":  # `unset`: the site's NCCL module or plugin chooses the transport
        env["NCCL_IB_DISABLE"] = "0" if net.ib else "1"
    if net.ib_hca:
        env["NCCL_IB_HCA"] = net.ib_hca
    if net.ib_gid_index is not None:
        env["NCCL_IB_GID_INDEX"] = str(net.ib_gid_index)
    if net.p2p_level:
        env["NCCL_P2P_LEVEL"] = net.p2p_level
    for section, values in (("network", net.env), ("environment", profile.environment.env)):
        for k, v in (values or {}).items():
            env[str(k)] = str(v)
            keys[str(k)] = f"{section}.env.{k}"
    return envrefs.order(env, keys, _origins(profile)), keys


def _origins(profile: ResolvedProfile) -> dict[str, str]:
    return dict(getattr(profile, "origins", None) or {})


def needs(
    profile: ResolvedProfile, env: list[tuple[str, str]], keys: dict[str, str]
) -> dict[str, Any]:
    """The script's `hpctrain_need` checks (hpctrain/render/envrefs.py), one place per profile value that
    the batch shell expands: before its module line, its activation, its export; the node python
    and the container after every export."""
    origins, c = _origins(profile), profile.environment.container
    exported = [name for name, _ in env]
    after = [
        envrefs.guard(keys.get(name, name), value, origins, exported[:i])
        for i, (name, value) in enumerate(env)
    ]
    late = []
    if profile.launch.python:
        late.append(envrefs.guard("launch.python", profile.launch.python, origins, exported))
    if c is not None:
        for field in ("image", "mounts", "workdir", "binary"):
            value = getattr(c, field)
            for v in value if isinstance(value, list) else [value] if value else []:
                late.append(envrefs.guard(f"environment.container.{field}", v, origins, exported))
    return {
        "env_need": dict(zip(exported, after, strict=True)),
        "module_needs": [
            envrefs.guard("environment.modules", m, origins) for m in profile.environment.modules
        ],
        "activate_need": envrefs.guard(
            "environment.activate", _home(profile.environment.activate or ""), origins
        ),
        "setup_needs": [g for g in late if g],
    }


def context(
    profile: ResolvedProfile,
    req: JobRequest,
    run_dir: str,
    python: str | None = None,
    *,
    chain: bool = False,
) -> dict[str, Any]:
    if not os.path.isabs(run_dir):
        raise UserError(f"internal: run folder {run_dir!r} must be absolute")
    problems = req.problems(profile)  # a request that does not fit the profile cannot be rendered
    if problems:
        raise ValidationError(problems)
    slurm = profile.scheduler == "slurm"
    cpus = cpus_per_task(profile, req)
    tasks = launch_context.tasks_per_node(profile, req)
    omp = max(1, (cpus * tasks if cpus else req.gpus) // req.gpus) if slurm else 1
    env, keys = _environment(profile, omp)
    return {
        **needs(profile, env, keys),
        **launch_context.context(profile, req, run_dir),
        "var": _VAR,
        "exit": _EXIT,
        "version": __version__,
        "scheduler": profile.scheduler,
        "chain": chain and slurm,  # submit --chain: segments hand over (hpctrain/runs/chain.py)
        "profile": profile,
        "job": req,
        # hot spares (preemption.spare_nodes): nodes the allocation holds beyond the training ones
        "spares": req.spares(profile),
        "run_dir": run_dir,
        "sbatch": sbatch_directives(profile, req, run_dir) if slurm else [],
        "srun_args": list(profile.slurm.srun_args),
        "env": env,  # OMP_NUM_THREADS included: derived, unless the profile sets it
        "omp_threads": omp,
        "cpus_per_task": cpus,
        "want_gpu": 1 if slurm and profile.slurm.gpus_per_node else 0,
        "python": python or node_python(profile),
        # launch.python may use $VAR (expanded on the node); any other source is a literal path
        "python_word": (
            shvalue
            if profile.launch.python and python in (None, profile.launch.python)
            else shlex.quote
        )(python or node_python(profile)),
        "entry_argv": req.entry.argv(run_dir=run_dir, strategy=req.strategy, args=req.args),
        "preemption": profile.preemption,
        "preflight": profile.preflight,
        "watchdog": profile.watchdog,
        "rendezvous": profile.rendezvous,
        "environment": profile.environment,
        "container": profile.environment.container,
        "activate_path": _home(profile.environment.activate or ""),
        "container_mounts": [*profile.environment.container.mounts, f"{run_dir}:{run_dir}"]
        if profile.environment.container
        else [],
    }


def render(
    profile: ResolvedProfile,
    req: JobRequest,
    run_dir: str | os.PathLike[str],
    *,
    python: str | None = None,
    chain: bool = False,
) -> str:
    """The script text, byte for byte what is handed to the scheduler. `python`: the nodes' interpreter
    (default node_python(profile); a resume passes run.yaml's `node_python` to render the same script)."""
    ctx = templating.plain(context(profile, req, str(run_dir), python, chain=chain))
    ctx["profile"]["source"] = str(profile.source) if getattr(profile, "source", None) else None
    ctx["profile"]["chain"] = [str(p) for p in getattr(profile, "chain", [])]
    text = templating.render_template(environment(), profile.template or TEMPLATE, ctx)
    check_topology(text, profile, req)
    return text


def check_topology(text: str, profile: ResolvedProfile, req: JobRequest) -> None:
    """One topology from one source: whatever a site template does, the script must carry exactly the
    request's nodes and GPUs per node, the launcher's tasks per node, and nothing that contradicts them."""
    want = {jobenv.NNODES: str(req.nodes), jobenv.GPUS_PER_NODE: str(req.gpus)}
    exports: dict[str, list[str]] = {}
    for line in text.splitlines():
        name, eq, value = line.removeprefix("export ").partition("=")
        if line.startswith("export ") and eq and not any(c.isspace() for c in value):
            exports.setdefault(name, []).append(value)
    for key, value in want.items():
        found = exports.get(key, [])
        if found != [value]:
            raise UserError(
                f"the rendered script sets {key}={found or 'nothing'}, the request says {value}: "
                "a mismatched topology cannot be rendered (check the site template)"
            )
    if profile.scheduler != "slurm":
        return
    lines = [
        ln.split()[1]
        for ln in text.splitlines()
        if ln.startswith("#SBATCH ") and len(ln.split()) > 1
    ]
    keyed: dict[str, list[str]] = {}
    for d in lines:
        keyed.setdefault(d.split("=", 1)[0], []).append(d)
    expect = {d.split("=", 1)[0]: d for d in node_directives(profile, req)}
    gpu = launch_context.gpu_directive(profile, req.gpus)
    if gpu:
        expect[gpu.split("=", 1)[0]] = gpu
    for key, line in expect.items():
        if keyed.get(key) != [line]:
            raise UserError(
                f"the rendered script has #SBATCH {keyed.get(key) or 'no ' + key}, the request "
                f"needs {line}: a mismatched topology cannot be rendered"
            )
    for bad in ("-N", "--ntasks", "--gpus", "--gpus-per-task"):
        if bad in keyed:
            raise UserError(
                f"the rendered script sets #SBATCH {bad}, which contradicts the request's "
                "topology: remove it from the template"
            )
