"""Figure for experiment 3: fp16 weights updated in place vs an fp32 master copy."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .style import figure_style, new_figure, save_figure

LOSS_FLOOR = 1e-8  # symlog's linear zone: exact zeros stay on the plot


def plot_lost_update_window(ax, bins, bits: int, label: str, color=None) -> None:
    """Fraction of updates lost against ``|w| / |u|`` (binned), with the window
    ``[2**bits, 2**(bits+1)]`` in which round-to-nearest starts and finishes losing them."""
    edges = np.array([row[0] for row in bins])
    fraction = np.array([row[2] / row[1] for row in bins])
    ax.semilogx(edges * 2 ** 0.125, fraction, marker="o", markersize=3, label=label,
                color=color)
    ax.axvspan(2.0 ** bits, 2.0 ** (bits + 1), alpha=0.12, color=color or "0.5")


def plot_master_weights(runs: dict, bins, bits: int, stem: Path) -> list[Path]:
    """``runs``: label -> (losses, lost fractions per step); ``bins``: ``[edge, updates,
    lost]`` rows for the run without a master copy."""
    with figure_style():
        fig, (loss_ax, lost_ax, ratio_ax) = new_figure(12.0, 3.6, ncols=3)
        for label, (losses, lost) in runs.items():
            steps = np.arange(len(losses))
            loss_ax.plot(steps, losses, label=label)
            if lost is not None:
                lost_ax.plot(steps, lost, label=label)
        loss_ax.set_yscale("symlog", linthresh=LOSS_FLOOR)
        loss_ax.set_ylim(bottom=0)
        loss_ax.set_xlabel("step")
        loss_ax.set_ylabel("training loss (MSE; symlog, 0 = exact fit)")
        loss_ax.set_title("loss: the fp16-only run stalls")
        loss_ax.legend(fontsize=7)
        lost_ax.set_xlabel("step")
        lost_ax.set_ylabel("fraction of updates lost")
        lost_ax.set_ylim(-0.03, 1.03)
        lost_ax.set_title("lost updates per step")
        lost_ax.legend(fontsize=7)
        plot_lost_update_window(ratio_ax, bins, bits, "fp16 weights, no master copy")
        ratio_ax.axvline(2.0 ** bits, color="0.3", linestyle="--", linewidth=0.8)
        ratio_ax.text(2.0 ** bits, 0.5, f" 2^{bits} = {2 ** bits}", fontsize=7, ha="right",
                      rotation=90, va="center")
        ratio_ax.set_xlabel("|weight| / |intended update|")
        ratio_ax.set_ylabel("fraction lost")
        ratio_ax.set_ylim(-0.03, 1.03)
        ratio_ax.set_title("the 2048x rule (shaded: partly lost)")
        fig.tight_layout()
        return save_figure(fig, stem)
