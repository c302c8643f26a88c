"""The #SBATCH lines of a job, in a fixed order: the request's topology, then the profile's slurm
section, the log, the preemption settings and the site's extra lines (the container kind's own
follow: hpctrain/jobs/spec.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.kernel.errors import UserError

if TYPE_CHECKING:
    from hpctrain.jobs.request import JobRequest
    from hpctrain.jobs.topology import Topology
    from hpctrain.profiles.resolved import ResolvedProfile

# Directives that hpctrain owns (one source of truth); a profile's extra_sbatch may not set them.
OWNED_DIRECTIVES = (
    "--job-name",
    "--nodes",
    "--ntasks",
    "--ntasks-per-node",
    "--gpus",
    "--gpus-per-node",
    "--gpus-per-task",
    "--gpus-per-socket",
    "--tres-per-task",
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
SLURM_KEYS = ("partition", "account", "qos", "constraint", "reservation")  # --KEY=value as given


def directives(
    profile: ResolvedProfile, req: JobRequest, topo: Topology, run_dir: str
) -> tuple[str, ...]:
    """Every #SBATCH line of hpctrain's and the profile's, without `#SBATCH `."""
    s, pre = profile.slurm, profile.preemption
    d = [f"--job-name={req.name}", *topo.node_directives()]
    if topo.gpu_directive:
        d.append(topo.gpu_directive)
    if topo.cpus_per_task:
        d.append(f"--cpus-per-task={topo.cpus_per_task}")
    if s.mem is not None:
        d.append(f"--mem={s.mem}")
    if s.mem_per_gpu is not None:
        d.append(f"--mem-per-gpu={s.mem_per_gpu}")
    d.append(f"--time={req.time_min}")
    d += [f"--{key}={getattr(s, key)}" for key in SLURM_KEYS if getattr(s, key)]
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
    d += [_extra(profile, line) for line in s.extra_sbatch]
    if topo.nodes + topo.spares == 1:
        d += list(s.single_node_sbatch)
    return tuple(d)


def _extra(profile: ResolvedProfile, line: str) -> str:
    key = line.split("=", 1)[0]
    if key in OWNED_DIRECTIVES:
        raise UserError(
            f"profile {profile.name}: slurm.extra_sbatch sets {key}, which hpctrain derives "
            "from the request and profile; remove it (use --nodes/--gpus/--time or the "
            "profile's own key)"
        )
    return line
