"""PNG plots of one run or several overlaid (matplotlib, Agg: no display needed)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from hpctrain.report.data import RunData

if TYPE_CHECKING:
    from matplotlib.axes import Axes  # matplotlib is the report extra's: imported where it draws


def _series(rd: RunData, column: str, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """The steps and values of the lines that have `column`: numpy views of the columns (no
    Python object per line)."""
    ys = np.frombuffer(rd.metrics.column(column), dtype=np.float64)
    keep = ~np.isnan(ys)
    xs, ys = np.frombuffer(rd.metrics.step, dtype=np.int64)[keep], ys[keep]
    return _envelope(xs, ys, scale) if len(xs) > 2 * BUCKETS else (xs, ys * scale)


BUCKETS = 1000  # a plot 800 pixels wide: a bucket a pixel or so (each is a vertical stroke)


def _envelope(xs: np.ndarray, ys: np.ndarray, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Each of BUCKETS runs of points as its lowest and its highest, in order: the same picture
    (every spike and dip stays) as 10^6 points, which cost Agg 340 MB to draw (10^5: 110 MB);
    about a pixel a bucket, as each is a vertical stroke Agg rasterises cell by cell."""
    width = -(-len(xs) // BUCKETS)
    whole = len(xs) // width * width
    rows = ys[:whole].reshape(-1, width)
    base = np.arange(0, whole, width)
    picked = np.concatenate(
        [base + rows.argmin(axis=1), base + rows.argmax(axis=1), np.arange(whole, len(xs))]
    )
    picked = np.unique(picked)  # sorted: the line goes left to right
    return xs[picked], ys[picked] * scale


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


PANELS: list[tuple[str, str, float, str, bool]] = [  # file, column, scale, y label, log scale
    ("loss.png", "loss", 1.0, "loss", False),
    ("throughput.png", "samples_per_s", 1.0, "samples/s", False),
    ("step_time.png", "step_time_s", 1000.0, "step time [ms]", False),
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
        if not any(len(_series(r, key)[0]) for r in runs):
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
    have_mem = any(len(_series(r, "mem_peak_gib")[0]) for r in runs)
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
        xs, ys = _series(rd, "mem_peak_gib")
        if len(xs):
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
