"""Figure for the fp4 experiment: NVFP4 with each ingredient off, beside bf16-mixed and MXFP4
(loss, typical gap to bf16, the flushed fraction of each cast, the read-out gradient's
rounding)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .overflow import running_mean
from .style import figure_style, new_figure, save_figure


def plot_fp4(runs: dict, reference: str, roles: tuple, head_rounding: dict, stem: Path,
             window: int = 5) -> list[Path]:
    """``runs``: label -> the experiment's numbers of one run (``losses``,
    ``typical_gap_to_bf16``, ``flushed_by_role_in_block``); ``roles``: the cast roles in
    order; ``head_rounding``: mode -> ``flushed`` and ``positive_part_kept``."""
    with figure_style():
        fig, axes = new_figure(12.0, 8.0, nrows=2, ncols=2)
        (loss_ax, gap_ax), (flush_ax, bias_ax) = axes
        labels = list(runs)
        base = running_mean(np.asarray(runs[reference]["losses"], np.float64), window)
        for i, label in enumerate(labels):
            losses = running_mean(np.asarray(runs[label]["losses"], np.float64), window)
            loss_ax.plot(losses - base, color=f"C{i}",
                         linewidth=2.4 if label == reference else 1.2, label=label)
        loss_ax.set_xlabel("step")
        loss_ax.set_ylabel(f"loss minus bf16-mixed's ({window}-step running means)")
        loss_ax.set_title("training loss against bf16-mixed's")
        loss_ax.legend(fontsize=7)
        _gap_bars(gap_ax, runs, labels, reference)
        _flush_bars(flush_ax, runs, labels, reference, roles)
        _rounding_bars(bias_ax, head_rounding)
        fig.tight_layout()
        return save_figure(fig, stem)


def _gap_bars(ax, runs: dict, labels: list, reference: str) -> None:
    shown = [label for label in labels if label != reference]
    y = np.arange(len(shown))
    gaps = [runs[label]["typical_gap_to_bf16"] for label in shown]
    ax.barh(y, gaps, color=[f"C{labels.index(label)}" for label in shown])
    for yi, gap in zip(y, gaps):
        ax.text(gap, yi, f" {gap:.4f}", va="center", fontsize=7)
    ax.set_yticks(y, shown, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("typical gap to bf16-mixed (median |difference| of 10-step means)")
    ax.set_title("how far each recipe's loss runs from bf16's")


def _flush_bars(ax, runs: dict, labels: list, reference: str, roles: tuple) -> None:
    shown = [label for label in labels if label != reference]
    x = np.arange(len(roles))
    width = 0.8 / len(shown)
    for k, label in enumerate(shown):
        by_role = runs[label]["flushed_by_role_in_block"]
        values = [100 * v if isinstance(v, float) and math.isfinite(v) else 0.0
                  for v in (by_role[role] for role in roles)]
        ax.bar(x - 0.4 + (k + 0.5) * width, values, width, label=label,
               color=f"C{labels.index(label)}")
    ax.set_xticks(x, roles, fontsize=7)
    ax.set_ylabel("% of the cast's nonzero values flushed to 0")
    ax.set_title("the block's casts, mean over layers and steps (MXFP4: no wgrad casts)",
                 fontsize=9)
    ax.legend(fontsize=7)


def _rounding_bars(ax, head_rounding: dict) -> None:
    modes = list(head_rounding)
    y = np.arange(len(modes))
    kept = [100 * head_rounding[m]["positive_part_kept"] for m in modes]
    flushed = [100 * head_rounding[m]["flushed"] for m in modes]
    ax.barh(y - 0.2, kept, height=0.4, color="C2",
            label="positive part kept (the push down on wrong tokens)")
    ax.barh(y + 0.2, flushed, height=0.4, color="C0", label="nonzero values flushed to 0")
    for yi, a, b in zip(y, kept, flushed):
        ax.text(a, yi - 0.2, f" {a:.1f}%", va="center", fontsize=7)
        ax.text(b, yi + 0.2, f" {b:.1f}%", va="center", fontsize=7)
    ax.axvline(100, color="0.4", linewidth=0.8, linestyle=":")
    ax.set_yticks(y, [m.replace("_", " ") for m in modes], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("% (of the gradient's positive part; of its nonzero values)")
    ax.set_xlim(0, 135)
    ax.set_title("one batch's read-out gradient in NVFP4 (1x16 blocks)", fontsize=9)
    ax.legend(fontsize=7, loc="center right")
