"""A job's shape, from the request (its ONE source) and the profile: nodes, GPUs per node, hot
spares, the launcher's tasks per node and the CPUs of each task, and the #SBATCH lines that say it
(the render's topology check holds the script to exactly these)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.kernel.values import frozen

if TYPE_CHECKING:
    from hpctrain.jobs.request import JobRequest
    from hpctrain.profiles.resolved import ResolvedProfile


@frozen
class Topology:
    nodes: int
    """Training nodes."""
    gpus: int
    """Per node: GPUs on Slurm, CPU worker processes per simulated node locally."""
    min_nodes: int | None
    """Fewest training nodes the run may continue on (a range: #SBATCH --nodes=M-N), else None."""
    spares: int
    """Hot spares (preemption.spare_nodes): nodes the allocation holds beyond the training ones."""
    tasks_per_node: int
    """srun tasks on each node (the launcher's: 1 for torchrun, one per GPU for srun)."""
    cpus_per_task: int | None
    """--cpus-per-task of one task (slurm.cpus_per_gpu / cpus_per_task), or None."""
    omp_threads: int
    """The derived OMP_NUM_THREADS: a task's CPUs per worker (1 locally)."""
    want_gpu: bool
    """The nodes have GPUs (a Slurm profile with slurm.gpus_per_node)."""
    gpu_directive: str | None
    """How the job asks for GPUs (slurm.gpu_request), or None."""

    def node_directives(self) -> list[str]:
        """#SBATCH --nodes (and --ntasks-per-node): the training nodes plus the spares, which the
        allocation holds and the training steps leave out."""
        if self.min_nodes is not None:
            # a range: no --ntasks-per-node, with which Slurm counts min x tasks and gives the
            # minimum; the srun steps inside give their own --ntasks-per-node
            return [f"--nodes={self.min_nodes + self.spares}-{self.nodes + self.spares}"]
        return [f"--nodes={self.nodes + self.spares}", f"--ntasks-per-node={self.tasks_per_node}"]


def topology(profile: ResolvedProfile, req: JobRequest, tasks_per_node: int) -> Topology:
    slurm = profile.scheduler == "slurm"
    cpus = task_cpus(profile, req.gpus, tasks_per_node)
    omp = max(1, (cpus * tasks_per_node if cpus else req.gpus) // req.gpus) if slurm else 1
    return Topology(
        nodes=req.nodes,
        gpus=req.gpus,
        min_nodes=(req.min_nodes or req.nodes) if req.node_range else None,
        spares=req.spares(profile),
        tasks_per_node=tasks_per_node,
        cpus_per_task=cpus,
        omp_threads=omp,
        want_gpu=slurm and bool(profile.slurm.gpus_per_node),
        gpu_directive=gpu_directive(profile, req.gpus),
    )


def task_cpus(profile: ResolvedProfile, gpus: int, tasks_per_node: int) -> int | None:
    """`--cpus-per-task` for one srun task, from slurm.cpus_per_gpu / slurm.cpus_per_task."""
    s = profile.slurm
    per_node = s.cpus_per_gpu * gpus if s.cpus_per_gpu else s.cpus_per_task
    if per_node is None:
        return None
    return max(1, per_node // tasks_per_node)


def gpu_directive(profile: ResolvedProfile, gpus: int) -> str | None:
    """How the job asks for GPUs (slurm.gpu_request), or None: no GPUs, or `none`, a whole-node
    allocation that asks for no GPUs by name."""
    s = profile.slurm
    if not s.gpus_per_node or not gpus or s.gpu_request == "none":
        return None
    count = f"{s.gpu_type}:{gpus}" if s.gpu_type else str(gpus)  # slurm.gpu_type: `A100:4`
    return f"--gres=gpu:{count}" if s.gpu_request == "gres" else f"--gpus-per-node={count}"
