"""Figure for experiment 5: bf16 needs no loss scaling, but loses more updates without a master
copy than fp16."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .master_weights import plot_lost_update_window
from .overflow import running_mean
from .style import figure_style, new_figure, save_figure


def plot_bf16(mixed: dict, reference: str, regression: dict, windows: dict, stem: Path,
              window: int = 20) -> list[Path]:
    """``mixed``: label -> per-step losses of the classification runs (``reference`` is the
    fp32 one); ``regression``: label -> per-step losses; ``windows``: label -> (ratio bins,
    significand bits) for the runs without a master copy."""
    with figure_style():
        fig, axes = new_figure(10.0, 7.0, nrows=2, ncols=2)
        (loss_ax, gap_ax), (reg_ax, ratio_ax) = axes
        base = np.asarray(mixed[reference], np.float64)
        styles = iter([("-", 2.4), ("--", 1.4), (":", 1.4)] * len(mixed))
        for label, losses in mixed.items():
            losses = np.asarray(losses, np.float64)
            style, width = next(styles)  # the curves coincide: styles keep each visible
            loss_ax.plot(running_mean(losses, window), label=label, linestyle=style,
                         linewidth=width)
            if label != reference:
                gap_ax.plot(losses - base, label=f"{label} minus {reference}", linewidth=0.8)
            else:
                gap_ax.plot([], [])  # keep the colours paired with the left panel
        loss_ax.set_title("classifier: same curve without loss scaling")
        loss_ax.set_xlabel("step")
        loss_ax.set_ylabel(f"training loss ({window}-step running mean)")
        loss_ax.legend(fontsize=7)
        gap_ax.axhline(0.0, color="0.3", linewidth=0.6)
        gap_ax.set_title("per-step loss difference from fp32")
        gap_ax.set_xlabel("step")
        gap_ax.set_ylabel("loss difference")
        gap_ax.legend(fontsize=7)
        for label, losses in regression.items():
            reg_ax.plot(np.asarray(losses, np.float64), label=label)
        reg_ax.set_yscale("log")
        reg_ax.set_title("linear regression at lr 0.01: where updates stall")
        reg_ax.set_xlabel("step")
        reg_ax.set_ylabel("training loss (MSE)")
        reg_ax.legend(fontsize=7)
        for i, (label, (bins, bits)) in enumerate(windows.items()):
            plot_lost_update_window(ratio_ax, bins, bits,
                                    f"{label} (shaded: 2^{bits}..2^{bits + 1})", color=f"C{i}")
        ratio_ax.set_title("updates lost from |w|/|u| = 256 (bf16), 2048 (fp16)")
        ratio_ax.set_xlabel("|weight| / |intended update|")
        ratio_ax.set_ylabel("fraction lost")
        ratio_ax.set_ylim(-0.03, 1.03)
        ratio_ax.legend(fontsize=7, loc="center right")
        fig.tight_layout()
        return save_figure(fig, stem)
