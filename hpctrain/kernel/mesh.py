"""The parallel layout: how the world is cut into pipeline, data and tensor parallel ranks.

One device mesh per run, dimensions outermost first: ("pp", "dp", "tp"). Tensor parallel is the
innermost (fastest-varying) dimension, so its ranks are consecutive and, with node-major ranks
(torchrun, srun), stay inside one node; pipeline stages are the outermost and cross nodes.
`dp` is what is left: world / (tp * pp).

`check_layout` is the one validation of a layout, torch-free, used by `hpctrain submit` (before
anything is queued, against the profile's topology) and by train_entry (at parse time): it returns
every problem, each with its fix, never only the first.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.kernel import strategies
from hpctrain.kernel.errors import Problem

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved_1f1b")
DEFAULT_SCHEDULE = "1f1b"
DIMS: tuple[str, ...] = ("pp", "dp", "tp")  # mesh order, outermost first


def stages_per_rank(schedule: str) -> int:
    """Pipeline stages one rank holds: interleaved 1F1B gives each rank 2 (virtual) stages."""
    return 2 if schedule == "interleaved_1f1b" else 1


@dataclass(frozen=True)
class Layout:
    """A valid layout's sizes (build it only after `check_layout` found no problem)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, d) for d in DIMS)

    @property
    def parallel(self) -> bool:
        """More than data parallel: a tp or pp dimension (needs a device mesh, a plan or split)."""
        return self.tp > 1 or self.pp > 1

    def describe(self) -> str:
        """'dp 2 x tp 2', the sizes over 1 in mesh order ('dp 1' for one rank)."""
        parts = [f"{d} {getattr(self, d)}" for d in DIMS if getattr(self, d) > 1]
        return " x ".join(parts) or "dp 1"

    @classmethod
    def of(cls, world: int, tp: int = 1, pp: int = 1) -> Layout:
        return cls(dp=max(world // max(tp * pp, 1), 1), tp=tp, pp=pp)


def _divisors(n: int, least: int = 1) -> str:
    return ", ".join(str(d) for d in range(least, n + 1) if n % d == 0) or "none"


def check_layout(
    *,
    world: int,
    tp: int = 1,
    pp: int = 1,
    gpus_per_node: int | None = None,
    n_layers: int | None = None,
    schedule: str = DEFAULT_SCHEDULE,
    microbatches: int | None = None,
    micro_batch: int | None = None,
    strategy: str | None = None,
) -> list[Problem]:
    """Every problem of the layout (tp, pp; dp fills the rest) at this world size, each naming the
    config key and its fix. Empty when it is valid. `gpus_per_node`, `n_layers`, `micro_batch`
    and `strategy` are checked only when known (a user model's layer count may not be)."""
    out = _positive(tp=tp, pp=pp)
    if out:
        return out
    out += _sizes(world=world, tp=tp, pp=pp, gpus_per_node=gpus_per_node)
    if schedule not in SCHEDULES:
        bad = f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}"
        return [*out, Problem(bad, key="parallel.schedule")]
    out += _stages(pp=pp, n_layers=n_layers, schedule=schedule)
    out += _microbatches(pp=pp, microbatches=microbatches, micro_batch=micro_batch)
    out += _strategy(strategy, tp=tp, pp=pp)
    return out


def _positive(*, tp: int, pp: int) -> list[Problem]:
    out = []
    if tp < 1:
        out.append(
            Problem(
                f"tp({tp}) must be at least 1; set --parallel.tp 1 (off) or more", key="parallel.tp"
            )
        )
    if pp < 1:
        out.append(
            Problem(
                f"pp({pp}) must be at least 1; set --parallel.pp 1 (off) or more", key="parallel.pp"
            )
        )
    return out


def _sizes(*, world: int, tp: int, pp: int, gpus_per_node: int | None) -> list[Problem]:
    """tp x pp against the world (dp must fill it) and tp against a node (it stays inside)."""
    out = []
    if world % (tp * pp):
        out.append(
            Problem(
                f"world size({world}) is not divisible by tp({tp}) * pp({pp}) = {tp * pp}, so no "
                f"data-parallel size fills it; use a world size that is a multiple of {tp * pp} "
                f"(nodes x gpus), or tp * pp among the divisors of {world}: {_divisors(world)}",
                key="parallel.tp" if pp == 1 else "parallel.pp" if tp == 1 else "parallel",
            )
        )
    if gpus_per_node and tp > 1 and gpus_per_node % tp:
        out.append(
            Problem(
                f"tp({tp}) does not divide the GPUs per node({gpus_per_node}): tensor parallel "
                f"must stay inside a node (its all-reduces run every layer); set --parallel.tp to "
                f"one of {_divisors(gpus_per_node)}",
                key="parallel.tp",
            )
        )
    return out


def _stages(*, pp: int, n_layers: int | None, schedule: str) -> list[Problem]:
    """The pipeline's stages against the model's layers and the schedule."""
    out = []
    v = stages_per_rank(schedule)
    if pp > 1 and n_layers is not None and n_layers % (pp * v):
        what = f"pp({pp}) x {v} stages per rank ({schedule})" if v > 1 else f"pp({pp}) stages"
        fits = [str(p) for p in range(2, n_layers + 1) if n_layers % (p * v) == 0]
        choice = f"one of {', '.join(fits)}" if fits else "1 (off)"
        out.append(
            Problem(
                f"{what} do not divide the model's {n_layers} layers; set --parallel.pp to "
                f"{choice}, or use a model with a multiple of {pp * v} layers",
                key="parallel.pp",
            )
        )
    if schedule == "interleaved_1f1b" and pp == 1:
        out.append(
            Problem(
                "interleaved_1f1b needs pipeline stages; set --parallel.pp 2 or more, or "
                "--parallel.schedule 1f1b",
                key="parallel.schedule",
            )
        )
    return out


def _microbatches(*, pp: int, microbatches: int | None, micro_batch: int | None) -> list[Problem]:
    """How the batch splits between the pipeline's stages."""
    key = "parallel.microbatches"
    if microbatches is None:
        if pp > 1 and micro_batch is not None and micro_batch % pp:
            return [
                Problem(
                    f"the pipeline splits train.micro_batch({micro_batch}) into pp({pp}) "
                    f"microbatches by default; set train.micro_batch to a multiple of {pp}, or "
                    "--parallel.microbatches",
                    key="train.micro_batch",
                )
            ]
        return []
    if pp == 1:
        why = (
            "microbatches split the batch between pipeline stages and pp is 1; unset "
            "--parallel.microbatches or set --parallel.pp 2 or more"
        )
        return [Problem(why, key=key)]
    if microbatches < pp:
        why = (
            f"microbatches({microbatches}) < pp({pp}) leaves stages idle every step; set "
            f"--parallel.microbatches {pp} or more (bubble (p-1)/(m+p-1) shrinks as m grows)"
        )
        return [Problem(why, key=key)]
    if micro_batch is not None and micro_batch % microbatches:
        why = (
            f"microbatches({microbatches}) does not divide train.micro_batch({micro_batch}); "
            f"set --parallel.microbatches to one of {_divisors(micro_batch, pp)}, or "
            "train.micro_batch to a multiple of it"
        )
        return [Problem(why, key=key)]
    return []


def _strategy(strategy: str | None, *, tp: int, pp: int) -> list[Problem]:
    """A strategy that is no mesh dimension cannot run with tp or pp."""
    if strategy is None or (tp == 1 and pp == 1) or strategy not in strategies.STRATEGIES:
        return []
    info = strategies.info(strategy)
    if info.mesh:
        return []
    why = f"{strategy} ({info.summary}) does not compose with tp/pp; {info.no_mesh}"
    return [Problem(why, key="strategy")]
