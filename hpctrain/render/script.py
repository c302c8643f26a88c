"""A JobSpec -> the batch script text: `render(spec)`.

Sandboxed Jinja (templates come from shared site directories) with StrictUndefined, and every `{{ }}`
value shell-quoted by a finalize hook unless it is `Sh` (already safe: built by one of the filters
below). Jinja comments are `{## ... ##}` (bash's `${#x}` would open a default one). The template
search path is site first (the SITE_PATH dirs' templates/, see kernel/jobenv.py; then the user's
config dir), the bundled template last; the bundled one is also reachable as "hpctrain/sbatch.sh.j2" so a
site template can `{% extends "hpctrain/sbatch.sh.j2" %}` and override one block (`{{ super() | safe }}` keeps the
original: like every value, super() is quoted otherwise). The bundled template takes its scheduler,
launcher and spares parts from the bundled folder only ("hpctrain/scheduler/slurm.sh.j2", ...).

The template reads a mapping made from the spec at the last step (`context`): its names are the
templates' vocabulary, which site templates use too. Rendering is deterministic: directives in a
fixed order, environment sorted by name (a value after the exports it names), absolute run folder.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable
from pathlib import Path

from jinja2 import Environment

from hpctrain import __version__
from hpctrain.jobs.spec import JobSpec
from hpctrain.kernel import exitcodes, jobenv
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.resources import bundled
from hpctrain.kernel.shell import DIRECTIVE, Sh, in_single_quotes, shvalue
from hpctrain.render import templating

TEMPLATE = "sbatch.sh.j2"
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# The job environment's names for the template ({{ var.RUN_DIR }}): hpctrain/kernel/jobenv.py.
_VAR = {key: Sh(name) for key, name in jobenv.template_names().items()}
# The exit codes the script reports ({{ exit.PREEMPTED }}): hpctrain/kernel/exitcodes.py's names.
_EXIT = {k: v for k, v in vars(exitcodes).items() if k.isupper() and isinstance(v, int)}


def _finalize(value: object) -> str:
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


def _shjoin(values: Iterable[object]) -> Sh:
    return Sh(" ".join(shlex.quote(str(v)) for v in values))


def _directive(value: object) -> Sh:
    # What a #SBATCH line can carry: the one pattern the profile schema validates with (what
    # validates renders). sbatch reads these lines itself; a newline would end the comment.
    if not DIRECTIVE.match(str(value)):
        raise UserError(
            f"cannot put {value!r} on an #SBATCH line: a directive is --key or --key=value "
            "with no spaces, quotes, newlines or shell characters"
        )
    return Sh(str(value))


def _envname(name: object) -> Sh:
    if not ENV_NAME_RE.match(str(name)):
        raise UserError(f"{name!r} is not an environment variable name (letters, digits, _)")
    return Sh(str(name))


_shvalue = shvalue  # the value grammar's quoting (hpctrain/kernel/shell.py)


def _prequoted(values: Iterable[object]) -> Sh:
    """Words hpctrain quoted itself (launcher and container parts of the spec), joined."""
    return Sh(" ".join(str(v) for v in values))


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


def environment() -> Environment:
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


def render(spec: JobSpec) -> str:
    """The script text, byte for byte what is handed to the scheduler."""
    ctx = context(spec)
    text = templating.render_template(environment(), spec.profile.template or TEMPLATE, ctx)
    check_topology(text, spec)
    return text


def context(spec: JobSpec) -> dict[str, object]:
    """The template's names; render_template makes them plain data (hpctrain/render/templating.py's
    `plain`)."""
    profile, setup, launch, topo = spec.profile, spec.setup, spec.launch, spec.topology
    part, box, run_dir = launch.part, spec.container, spec.run_dir
    c = profile.environment.container
    plain_profile = templating.plain(profile)
    assert isinstance(plain_profile, dict)
    plain_profile["source"] = str(profile.source) if getattr(profile, "source", None) else None
    plain_profile["chain"] = [str(p) for p in getattr(profile, "chain", [])]
    ctx: dict[str, object] = {
        "var": _VAR,
        "exit": _EXIT,
        "version": __version__,
        "scheduler": spec.scheduler,
        "profile": plain_profile,
        "job": spec.request,
        "run_dir": run_dir,
        "sbatch": list(spec.directives),
        # topology: hot spares (preemption.spare_nodes) are nodes beyond the training ones
        "spares": topo.spares,
        "tasks_per_node": topo.tasks_per_node,
        "cpus_per_task": topo.cpus_per_task,
        "omp_threads": topo.omp_threads,
        "want_gpu": 1 if topo.want_gpu else 0,
        # setup: the batch shell's environment, each profile value after its guard
        "module_lines": [m.words for m in setup.modules],
        "module_needs": [m.guard for m in setup.modules],
        "setup_lines": list(setup.lines),
        "environment": profile.environment,
        "activate_path": setup.activate_path,
        "activate_need": setup.activate_guard,
        "conda_env": setup.conda_env,
        "activate_in_task": setup.activate_in_task,
        "env": [(e.name, e.value) for e in setup.exports],
        "env_need": {e.name: e.guard for e in setup.exports},
        "setup_needs": list(setup.late_guards),
        "task_env": list(setup.task_env),
        "task_setup_lines": list(setup.task_lines),
        "umask": setup.umask,
        # launch
        "launcher": launch.launcher,
        "step_options": list(launch.step_options),
        "torchrun_command": list(part.command),
        "torchrun_restarts": list(part.restarts),
        "torchrun_args": list(part.options),
        "rdzv_backend": part.rdzv_backend,
        "srun_args": list(launch.srun_args),
        "srun_args_if": list(launch.srun_args_if),
        "entry_argv": list(launch.entry_argv),
        "python": launch.python,
        "python_word": launch.python_word,
        "rendezvous": launch.rendezvous,
        "head_suffix": launch.rendezvous.host_suffix,
        "head_interface": launch.rendezvous.interface,
        "fixed_port": launch.rendezvous.port,
        "gloo_prefix": launch.gloo_prefix,
        "gloo_words": launch.gloo_words,
        # the container
        "container": c,
        "container_srun": list(box.srun_options) if box else [],
        "container_prefix": list(box.prefix) if box else [],
        "container_mounts": [*c.mounts, f"{run_dir}:{run_dir}"] if c else [],
        # recovery
        "preemption": spec.recovery.preemption,
        "preflight": spec.recovery.preflight,
        "watchdog": spec.recovery.watchdog,
        "chain": spec.recovery.chain,
    }
    return ctx  # made plain data once, by render_template


def check_topology(text: str, spec: JobSpec) -> None:
    """One topology from one source: whatever a site template does, the script must carry exactly
    the spec's nodes and GPUs per node, the launcher's tasks per node, and nothing that contradicts
    them."""
    topo = spec.topology
    want = {jobenv.NNODES: str(topo.nodes), jobenv.GPUS_PER_NODE: str(topo.gpus)}
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
    if spec.scheduler == "slurm":
        _check_directives(text, topo.node_directives() + [topo.gpu_directive or ""])


def _check_directives(text: str, expected: list[str]) -> None:
    keyed: dict[str, list[str]] = {}
    for ln in text.splitlines():
        if ln.startswith("#SBATCH ") and len(ln.split()) > 1:
            d = ln.split()[1]
            keyed.setdefault(d.split("=", 1)[0], []).append(d)
    for line in filter(None, expected):
        key = line.split("=", 1)[0]
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
