"""Per-layer statistics as heatmaps: ``plot_layers`` (``fpsim plot --per-layer RUN``) draws a
run's ``layers.jsonl`` (``fpsim train --per-layer``) in three panels, parameter x step: the
percentage of its gradient values that underflowed, the percentage of its updates lost, and
log2 of its gradient's largest magnitude (as stored, times the loss scale). Cells that were
not measured (a rounding not matched to its gradient) or not finite are drawn grey.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..train.layer_stats import LAYERS_FILE, read_layer_stats
from .style import figure_style, new_figure, write_user_figure

import matplotlib.pyplot as plt  # noqa: E402  (style chose the backend)

__all__ = ["plot_layers", "LAYER_PANELS"]

# (statistic, title, colour bar label, transform)
LAYER_PANELS = (
    ("grad_underflow", "gradient underflow", "% of nonzero gradient values flushed to 0",
     "percent"),
    ("lost_updates", "lost updates", "% of the parameter's updates lost", "percent"),
    ("grad_max", "largest gradient magnitude", "log2 |g| max (as stored, times the scale)",
     "log2"),
)


def _layers_path(run: "str | os.PathLike") -> Path:
    path = Path(run)
    if path.is_dir():
        path = path / LAYERS_FILE
    if not path.exists():
        raise FileNotFoundError(f"no per-layer statistics at {path}: train the run with "
                                f"--per-layer (fpsim train --per-layer --out RUN)")
    return path


def _matrix(steps, statistic: str, transform: str) -> np.ndarray:
    values = np.array([getattr(s, statistic) for s in steps], np.float64).T   # parameter x step
    with np.errstate(divide="ignore", invalid="ignore"):
        if transform == "percent":
            values = values * 100.0
        elif transform == "log2":
            values = np.log2(values)
    return np.ma.masked_invalid(values)


def plot_layers(run: "str | os.PathLike", out: "str | os.PathLike") -> Path:
    """Draw the run's ``layers.jsonl`` into ``out`` (``.png`` or ``.svg``, the same bytes for
    the same statistics); checked before anything is written; returns the path written."""
    out = Path(out)
    if out.suffix.lower() not in (".png", ".svg"):
        raise ValueError(f"cannot write a figure to {out}: the name must end in .png or .svg")
    names, steps = read_layer_stats(_layers_path(run))
    if not steps:
        raise ValueError(f"{_layers_path(run)} holds no steps yet")
    with figure_style():
        fig, axes = new_figure(12.0, 2.0 + 1.1 * len(LAYER_PANELS) + 0.25 * len(names) * 3,
                               nrows=len(LAYER_PANELS), ncols=1)
        for ax, (statistic, title, label, transform) in zip(axes, LAYER_PANELS):
            cmap = plt.get_cmap("viridis").with_extremes(bad="0.8")
            image = ax.imshow(_matrix(steps, statistic, transform), aspect="auto",
                              interpolation="nearest", cmap=cmap,
                              extent=(-0.5, len(steps) - 0.5, len(names) - 0.5, -0.5))
            ax.set_yticks(range(len(names)), names, fontsize=7)
            ax.set_title(title)
            ax.set_xlabel("step")
            fig.colorbar(image, ax=ax, label=label)
        fig.tight_layout()
        return write_user_figure(fig, out)
