"""Figure for experiment 2: training loss per step for each precision and loss-scaling choice
(the paper's Fig. 5 style), the fraction of gradient values that underflowed each step, and
how much of each layer had moved from its initial weights at a snapshot step (dashed line)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .style import figure_style, new_figure, save_figure

COLORS = ["#222222", "#d35400", "#2980b9", "#27ae60"]
STYLES = ["-", "-", "--", ":"]
SMOOTH = 10


def _trailing_mean(values, window: int) -> np.ndarray:
    values = np.asarray(values, np.float64)
    sums = np.cumsum(np.concatenate([[0.0], values]))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    return (sums[1:] - sums[np.arange(1, len(values) + 1) - counts]) / counts


def plot_loss_curves(runs: dict, plateau: float, snapshot: int, stem: Path) -> list[Path]:
    with figure_style():
        fig, (ax, ux, wx) = new_figure(13.0, 3.8, ncols=3,
                                       gridspec_kw={"width_ratios": [1.5, 1, 1]})
        for (label, r), color, ls in zip(runs.items(), COLORS, STYLES):
            steps = np.arange(len(r["losses"]))
            ax.plot(steps, r["losses"], color=color, lw=0.5, alpha=0.25)
            ax.plot(steps, _trailing_mean(r["losses"], SMOOTH), color=color, ls=ls, lw=1.5,
                    label=label)
            ux.plot(steps, 100 * np.asarray(r["underflow_fraction"]), color=color, ls=ls,
                    lw=1.0, label=label)
            moved = r["weights_moved_at_snapshot"]
            wx.plot(np.arange(1, len(moved) + 1), 100 * np.asarray(moved), color=color, ls=ls,
                    marker="o", ms=3.5, lw=1.2, label=label)
        ax.axhline(plateau, color="0.5", lw=0.8, ls=(0, (4, 3)))
        # "log(8)", not "ln 8": in DejaVu Sans a lower-case l reads as a capital I ("In 8")
        ax.annotate(f"log({round(np.exp(plateau))}) = {plateau:.3f}: guessing the class "
                    f"frequencies", (0, plateau), xytext=(4, 4),
                    textcoords="offset points", fontsize=7, color="0.35")
        ax.set_xlabel("training step")
        ax.set_ylabel(f"training loss (faint: per step; bold: mean of {SMOOTH})")
        ax.set_title("Training loss")
        top = plateau * 1.25
        ax.set_ylim(0, top)
        for r, color in zip(runs.values(), COLORS):
            peak = int(np.argmax(r["losses"]))
            if r["losses"][peak] > top:
                # the text sits in the empty band below the plateau, an arrow to the spike
                ax.annotate(_spike_text(r["losses"][peak], peak, r.get("spike")), (peak, top),
                            xytext=(0.72, 0.74), textcoords="axes fraction", fontsize=6.5,
                            color=color, ha="right", va="top",
                            arrowprops={"arrowstyle": "->", "color": color, "lw": 0.8})
        ax.legend(fontsize=7, loc="lower left", frameon=True, facecolor="white",
                  framealpha=0.9, edgecolor="none")
        ux.set_xlabel("training step")
        ux.set_ylabel("% of nonzero gradient values flushed to 0")
        ux.set_title("Gradient underflow in backward")
        ux.set_ylim(bottom=0)
        wx.set_xlabel("layer (input side first; 11 = logits)")
        wx.set_ylabel("% of the layer's weights changed from init")
        wx.set_title(f"Weights changed by step {snapshot}")
        wx.set_xticks(list(range(1, len(next(iter(runs.values()))["weights_moved"]) + 1)))
        ux.axvline(snapshot, color="0.5", lw=0.8, ls=(0, (4, 3)))
        ax.axvline(snapshot, color="0.5", lw=0.8, ls=(0, (4, 3)))
        wx.set_ylim(-3, 103)
        fig.tight_layout()
        return save_figure(fig, stem)


def _spike_text(loss: float, step: int, spike: dict | None) -> str:
    """What the spike is and, when the experiment found its trigger, why it happened."""
    text = f"spike to {loss:.3g} at step {step} (off scale)"
    if not spike or spike["step"] != step or spike["trigger_step"] is None:
        return text
    ratio = spike["trigger_grad_norm"] / spike["usual_grad_norm"]
    text += (f":\nan outlier batch at step {spike['trigger_step']} (gradient\nnorm "
             f"{ratio:.0f}x the usual) that Adam's momentum\nkeeps following")
    skipped = spike["skipped_steps"]
    if skipped:
        steps = ", ".join(map(str, skipped))
        text += (f"; the spike's fp16\ngradients overflow: step{'s' if len(skipped) > 1 else ''} "
                 f"{steps} skipped,\nscale {spike['scale']:g} -> {spike['scale_after']:g}")
    return text
