"""Figure for experiment 8: FP8 recipes and an outlier (loss, the first GEMM's input scale,
its flushed values around the outlier, and what saturated or flushed at the outlier)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .overflow import running_mean
from .style import figure_style, new_figure, save_figure


def plot_fp8(curves: dict, reference: str, outlier: int, stem: Path,
             window: int = 20) -> list[Path]:
    """``curves``: label -> (losses, input scale, saturated, flushed) per step (NaN where a
    recipe has no such statistic); ``reference``: the bf16 run's label."""
    with figure_style():
        fig, axes = new_figure(11.0, 7.5, nrows=2, ncols=2)
        (loss_ax, scale_ax), (flush_ax, bar_ax) = axes
        for i, (label, (losses, scale, _saturated, flushed)) in enumerate(curves.items()):
            color = f"C{i}"
            width = 2.4 if label == reference else 1.2
            loss_ax.plot(running_mean(losses, window), label=label, color=color,
                         linewidth=width)
            if not np.isnan(scale).all():
                scale_ax.plot(scale, label=label, color=color, linewidth=1.2)
            if not np.isnan(flushed).all():
                flush_ax.plot(100 * flushed, label=label, color=color, linewidth=1.0)
        for ax in (loss_ax, scale_ax, flush_ax):
            ax.axvline(outlier, color="0.4", linewidth=0.8, linestyle=":")
            ax.set_xlabel("step")
        loss_ax.set_title("training loss: the recipes track bf16-mixed")
        loss_ax.set_ylabel(f"loss ({window}-step running mean)")
        loss_ax.legend(fontsize=7)
        scale_ax.set_yscale("log")
        scale_ax.set_title("first layer's input scale (per-tensor recipes)")
        scale_ax.set_ylabel("scale (448 / amax of the history)")
        scale_ax.legend(fontsize=7)
        flush_ax.set_title("first layer's inputs flushed to zero")
        flush_ax.set_ylabel("% of the step's inputs")
        flush_ax.set_xlim(max(0, outlier - 20), len(next(iter(curves.values()))[0]))
        flush_ax.legend(fontsize=7)
        _outlier_bars(bar_ax, curves, outlier)
        fig.tight_layout()
        return save_figure(fig, stem)


def _outlier_bars(ax, curves: dict, outlier: int) -> None:
    labels = [label for label, c in curves.items() if not np.isnan(c[2]).all()]
    saturated = [100 * curves[label][2][outlier] for label in labels]
    flushed = [100 * curves[label][3][outlier] for label in labels]
    y = np.arange(len(labels))
    ax.barh(y - 0.2, saturated, height=0.4, label="saturated (clipped to +-448)", color="C3")
    ax.barh(y + 0.2, flushed, height=0.4, label="flushed to zero", color="C0")
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_title(f"at the outlier step ({outlier}): the first layer's inputs")
    ax.set_xlabel("% of the batch's inputs")
    ax.legend(fontsize=7)
