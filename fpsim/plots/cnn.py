"""Figure for the CNN experiment: the residual CNN's activation gradients against fp16's range
at initialisation and after fp32 training (the paper's Fig. 3 style), per layer, and the
training loss and gradient underflow of each precision recipe."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .overflow import running_mean
from .style import figure_style, new_figure, save_figure
from .underflow import COLORS, NORMAL_BOTTOM, power_ticks, shade_fp16_ranges

RUN_COLORS = ["#222222", "#d35400", "#2980b9", "#27ae60", "#8e44ad"]
RUN_STYLES = ["-", "-", "--", ":", "-."]
SMOOTH = 5
VIEW_LOW = -48   # the histogram's left edge: a fit sample's gradients reach 2**-140 and below


def plot_cnn(at_init: dict, trained: dict, runs: dict, layers: list[str],
             stem: Path) -> list[Path]:
    """``at_init``/``trained``: ``gradients_report`` dicts; ``runs``: label -> run numbers
    (``losses``, ``underflow_fraction`` per step), drawn in the dict's order, which picks
    each run's colour (``summary.json`` sorts its keys: put them back in ``RUNS`` order
    before redrawing from it)."""
    low = max(VIEW_LOW, min(at_init["histogram"]["exponents"][0],
                            trained["histogram"]["exponents"][0]) - 1)
    high = max(at_init["histogram"]["exponents"][-1], trained["histogram"]["exponents"][-1],
               NORMAL_BOTTOM) + 2
    ticks = list(range(4 * math.ceil(low / 4), high + 1, 4))
    with figure_style():
        fig, axes = new_figure(11.0, 7.4, nrows=2, ncols=2)
        (hx, lx), (cx, ux) = axes
        shade_fp16_ranges(hx, low, high, vertical=True)
        tallest = 0.0
        for report, label, style in ((trained, "after fp32 training", "bars"),
                                     (at_init, "at initialisation", "outline")):
            exponents = np.asarray(report["histogram"]["exponents"])
            counts = np.asarray(report["histogram"]["counts"], np.float64)
            percent = 100.0 * counts / counts.sum()
            lost = 100.0 * report["fractions"]["lost_of_nonzero"]
            hidden = percent[exponents < low].sum()
            text = f"{label}: {lost:.1f}% lost in fp16" + (
                f",\n{hidden:.1f}% below $2^{{{low}}}$ (off the plot)" if hidden >= 0.05 else "")
            tallest = max(tallest, percent.max())
            if style == "bars":
                hx.bar(exponents, percent, width=1.0, align="edge", color=COLORS["bars"],
                       edgecolor="white", lw=0.4, zorder=2, label=text)
            else:
                hx.stairs(percent, np.append(exponents, exponents[-1] + 1), color="#c0392b",
                          lw=1.4, zorder=3, label=text)
        hx.set_xlim(low, high)
        hx.set_ylim(0, 1.8 * tallest)     # room for the legend above the bars
        hx.set_xticks(ticks, power_ticks(ticks))
        hx.set_xlabel("|activation gradient| (bar at $2^e$: values in [$2^e$, $2^{e+1}$))")
        hx.set_ylabel("% of nonzero values")
        hx.set_title("Activation gradients (fp32) against fp16's range")
        hx.legend(fontsize=7, loc="upper left", frameon=True, facecolor="white",
                  framealpha=0.9, edgecolor="none")

        positions = np.arange(len(layers))
        for report, label, color, shift in ((at_init, "at initialisation", "#c0392b", -0.2),
                                            (trained, "after fp32 training", COLORS["bars"],
                                             0.2)):
            lost = [100.0 * v for v in report["layer_lost_of_nonzero"]]
            lx.bar(positions + shift, lost, width=0.4, color=color, label=label)
        lx.set_xticks(positions, [name.replace(" conv", "\nconv") for name in layers],
                      fontsize=7)
        lx.set_ylabel("% of nonzero values lost in fp16")
        lx.set_xlabel("layer output (input side first)")
        lx.set_title("Per layer: lost values")
        lx.legend(fontsize=7)

        for (label, r), color, ls in zip(runs.items(), RUN_COLORS, RUN_STYLES):
            steps = np.arange(len(r["losses"]))
            cx.plot(steps, running_mean(r["losses"], SMOOTH), color=color, ls=ls,
                    label=label)
            ux.plot(steps, 100.0 * np.asarray(r["underflow_fraction"]), color=color, ls=ls,
                    label=label)
        cx.set_yscale("log")
        cx.set_xlabel("step")
        cx.set_ylabel(f"training loss ({SMOOTH}-step trailing mean)")
        cx.set_title("Training loss by recipe (same weights, same batches)")
        cx.legend(fontsize=7)
        ux.set_xlabel("step")
        ux.set_ylabel("% of nonzero gradient values flushed to 0")
        ux.set_title("Gradient underflow in backward, per step")
        fig.tight_layout()
        return save_figure(fig, stem)
