"""JobSpec: everything the batch script says about one job, typed, built once from the resolved
profile and a checked request, and handed to hpctrain/render/script.py's `render(spec)`.

    topology     nodes, GPUs per node, hot spares, tasks per node, CPUs (hpctrain/jobs/topology.py)
    directives   the #SBATCH lines (hpctrain/jobs/directives.py)
    setup        modules, activation, the ordered exports and their guards (hpctrain/jobs/exports.py)
    launch       the launcher's part (hpctrain/launchers/), the srun step's options, the entry
    container    the container kind's part (hpctrain/containers/), or None
    recovery     preemption, requeue, the preflight gate, the watchdog, a chain's hand-over

Every word in it is shell-safe (`Sh`) or plain data the template quotes.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from hpctrain import containers, launchers
from hpctrain.jobs.directives import directives
from hpctrain.jobs.exports import Setup, setup
from hpctrain.jobs.topology import Topology, topology
from hpctrain.kernel import jobenv
from hpctrain.kernel.errors import UserError
from hpctrain.kernel.shell import Sh, quote, shvalue
from hpctrain.kernel.values import frozen

if TYPE_CHECKING:
    from hpctrain.jobs.request import JobRequest
    from hpctrain.launchers import LaunchPart
    from hpctrain.profiles.health import Preflight, Watchdog
    from hpctrain.profiles.resolved import ResolvedProfile
    from hpctrain.profiles.schema.launch import Preemption, Rendezvous


@frozen
class Launch:
    launcher: str
    """launch.launcher: its module (hpctrain/launchers/) and template (templates/launch/)."""
    part: LaunchPart
    step_options: tuple[Sh, ...]
    """The launcher's srun options of the training step, quoted."""
    srun_args: tuple[str, ...]
    srun_args_if: tuple[tuple[Sh, Sh], ...]
    """slurm.srun_args_if_exists: (the path, the options), tested on the node."""
    entry_argv: tuple[str, ...]
    """What each training process runs after the interpreter (or torchrun's options)."""
    python: str
    """The nodes' interpreter."""
    python_word: Sh
    rendezvous: Rendezvous
    gloo_prefix: str | None
    """network.socket_ifname as prefixes, resolved to gloo's exact names on each node."""
    gloo_words: Sh


@frozen
class ContainerPart:
    kind: str
    srun_options: tuple[Sh, ...]
    """srun options (pyxis, edf)."""
    prefix: tuple[Sh, ...]
    """Words before `bash -c NODE_CMD` (apptainer, shifter)."""
    sbatch: tuple[str, ...]
    """Its own #SBATCH lines (shifter's --image)."""


@frozen
class Recovery:
    preemption: Preemption
    """The signal and its warning, requeues, in-job restarts, hot spares."""
    preflight: Preflight
    watchdog: Watchdog
    chain: bool
    """A segment of a chain (submit --chain, Slurm): it hands over to the next one."""


@frozen
class JobSpec:
    profile: ResolvedProfile
    """The profile, which a site template may read any key of."""
    request: JobRequest
    run_dir: str
    """The run folder, absolute."""
    scheduler: str
    topology: Topology
    directives: tuple[str, ...]
    """#SBATCH lines (Slurm only; empty for the local executor)."""
    setup: Setup
    launch: Launch
    container: ContainerPart | None
    recovery: Recovery

    @classmethod
    def build(
        cls,
        profile: ResolvedProfile,
        req: JobRequest,
        run_dir: str | os.PathLike[str],
        *,
        python: str | None = None,
        chain: bool = False,
    ) -> JobSpec:
        """`req` is a checked request (JobRequest.build, or `req.problems(profile)` empty).
        `python`: the nodes' interpreter (default node_python(profile); a resume passes run.yaml's
        `node_python` to render the same script)."""
        run_dir = str(run_dir)
        if not os.path.isabs(run_dir):
            raise UserError(f"internal: run folder {run_dir!r} must be absolute")
        slurm = profile.scheduler == "slurm"
        part = launchers.get(profile.launch.launcher).part(profile, req.gpus)
        topo = topology(profile, req, part.tasks_per_node)
        box = container_part(profile, run_dir)
        lines = directives(profile, req, topo, run_dir) if slurm else ()
        return cls(
            profile=profile,
            request=req,
            run_dir=run_dir,
            scheduler=profile.scheduler,
            topology=topo,
            directives=(*lines, *box.sbatch) if box and slurm else lines,
            setup=setup(profile, topo.omp_threads),
            launch=launch(profile, req, part, run_dir=run_dir, python=python),
            container=box,
            recovery=Recovery(
                preemption=profile.preemption,
                preflight=profile.preflight,
                watchdog=profile.watchdog,
                chain=chain and slurm,  # segments hand over (hpctrain/runs/chain.py)
            ),
        )


def launch(
    profile: ResolvedProfile, req: JobRequest, part: LaunchPart, *, run_dir: str, python: str | None
) -> Launch:
    node = python or node_python(profile)
    # launch.python may use $VAR (expanded on the node); any other source is a literal path
    expands = profile.launch.python and python in (None, profile.launch.python)
    gloo = profile.network.gloo_prefix
    return Launch(
        launcher=profile.launch.launcher,
        part=part,
        step_options=tuple(quote(o) for o in part.step_options),
        srun_args=tuple(profile.slurm.srun_args),
        srun_args_if=tuple(
            (shvalue(path), Sh(" ".join(quote(o) for o in opts)))
            for path, opts in profile.slurm.srun_args_if_exists.items()
            if opts
        ),
        entry_argv=tuple(req.entry.argv(run_dir=run_dir, strategy=req.strategy, args=req.args)),
        python=node,
        python_word=shvalue(node) if expands else quote(node),
        rendezvous=profile.rendezvous,
        gloo_prefix=gloo,
        gloo_words=Sh(" ".join(shvalue(w) for w in (gloo or "").split(","))),
    )


def container_part(profile: ResolvedProfile, run_dir: str) -> ContainerPart | None:
    c = profile.environment.container
    if c is None:
        return None
    kind = containers.get(c.kind)
    gpu = profile.slurm.gpu_vendor if profile.slurm.gpus_per_node else None
    # SRC:DST[:OPTS] (a bare path mounted at itself), the run folder last; an EDF mounts its own
    bare = [m if ":" in m else f"{m}:{m}" for m in c.mounts]
    where = [] if c.kind == "edf" else [*bare, f"{run_dir}:{run_dir}"]
    return ContainerPart(
        kind=c.kind,
        srun_options=tuple(kind.srun_options(c, where, gpu)),
        prefix=tuple(kind.prefix(c, where, gpu)),
        sbatch=tuple(kind.sbatch(c)),
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
