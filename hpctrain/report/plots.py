"""PNG plots of one run or several overlaid (matplotlib, Agg: no display needed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from hpctrain.report.data import Metric, RunData

if TYPE_CHECKING:
    from matplotlib.axes import Axes  # matplotlib is the report extra's: imported where it draws

Value = Callable[[Metric], float | None]


def _series(rd: RunData, value: Value, scale: float = 1.0) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for m in rd.metrics:
        v = value(m)
        if v is not None:
            xs.append(m.step)
            ys.append(v * scale)
    return xs, ys


def _mark(ax: Axes, rd: RunData, color: str, *, labelled: bool) -> None:
    """Restarts: a dashed line where training resumed; checkpoints: ticks on the step axis."""
    for i, seg in enumerate(rd.segments[1:]):
        ax.axvline(
            seg.first_step - 1,
            color=color,
            linestyle="--",
            linewidth=1,
            alpha=0.8,
            label="restart (resumed here)" if labelled and i == 0 else None,
        )
    steps = sorted(
        {s.step for s in rd.saves if s.step is not None} | {c.step for c in rd.checkpoints}
    )
    if steps:
        ax.plot(
            steps,
            [0] * len(steps),
            linestyle="none",
            marker="^",
            color=color,
            markersize=6,
            transform=ax.get_xaxis_transform(),
            clip_on=False,
            label="checkpoint" if labelled else None,
        )


PANELS: list[tuple[str, Value, float, str, bool]] = [  # file, value, scale, y label, log scale
    ("loss.png", lambda m: m.loss, 1.0, "loss", False),
    ("throughput.png", lambda m: m.samples_per_s, 1.0, "samples/s", False),
    ("step_time.png", lambda m: m.step_time_s, 1000.0, "step time [ms]", False),
]
COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red"]


def write(runs: list[RunData], out: Path) -> list[Path]:
    """One PNG per panel into `out` (created); several runs are overlaid, one colour each."""
    import matplotlib  # lazy: CLI start-up: matplotlib for the PNGs only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after use("Agg")

    out.mkdir(parents=True, exist_ok=True)
    written = []
    title = " vs ".join(r.name for r in runs)
    for name, key, scale, label, log in PANELS:
        if not any(_series(r, key)[0] for r in runs):
            continue
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
        for i, rd in enumerate(runs):
            color = COLORS[i % len(COLORS)]
            xs, ys = _series(rd, key, scale)
            ax.plot(xs, ys, color=color, linewidth=1.4, label=rd.name if len(runs) > 1 else None)
            _mark(ax, rd, color, labelled=i == 0)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        if log:
            ax.set_yscale("log")
        ax.set_title(f"{title}: {label}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        path = out / name
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    gpu = _gpu(runs, out, plt)
    return written + ([gpu] if gpu else [])


def _gpu(runs: list[RunData], out: Path, plt: ModuleType) -> Path | None:
    """GPU utilisation (nvidia-smi samples) and memory (per-step peak) when the run has them."""
    have_smi = any(r.gpu for r in runs)
    have_mem = any(any(m.mem_peak_gib for m in r.metrics) for r in runs)
    if not (have_smi or have_mem):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), dpi=100)
    for i, rd in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        t0 = next((g.t for g in rd.gpu if g.t), 0.0)
        util = [(g.t - t0, g.utilization) for g in rd.gpu if g.t and g.utilization is not None]
        if util:
            axes[0].plot(
                [u[0] for u in util],
                [u[1] for u in util],
                ".",
                color=color,
                label=rd.name,
                markersize=3,
            )
        xs = [m.step for m in rd.metrics if m.mem_peak_gib]
        ys = [max(m.mem_peak_gib) for m in rd.metrics if m.mem_peak_gib]
        if xs:
            axes[1].plot(xs, ys, color=color, label=rd.name)
    axes[0].set(
        xlabel="seconds since first sample",
        ylabel="GPU utilisation [%]",
        title="GPU utilisation (nvidia-smi)",
    )
    axes[1].set(xlabel="step", ylabel="peak memory [GiB], max over ranks", title="GPU memory")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "gpu.png"
    fig.savefig(path)
    plt.close(fig)
    return path
