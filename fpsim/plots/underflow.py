"""Figure for experiment 1: the histogram of log2|activation gradient| against fp16's ranges
(the paper's Fig. 3), and the same gradients layer by layer."""
from __future__ import annotations

import math
from pathlib import Path

from .style import figure_style, new_figure, save_figure

# fp16's ranges on the log2|g| axis: lost (|g| <= 2**-25 rounds to 0), subnormal, normal.
LOST_TOP, SUBNORMAL_BOTTOM, NORMAL_BOTTOM = -25, -24, -14
BAND = (-27, -24)
COLORS = {"lost": "#f2c4c4", "subnormal": "#f6e7b0", "normal": "#cfe8cf", "band": "#c0392b",
          "bars": "#34495e"}


def shade_fp16_ranges(ax, low: float, high: float, *, vertical: bool) -> None:
    """Shade fp16's lost, subnormal and normal ranges on a log2|g| axis from ``low`` to
    ``high`` (x when ``vertical``, else y), with dotted lines at their edges."""
    span = ax.axvspan if vertical else ax.axhspan
    span(low, LOST_TOP, color=COLORS["lost"], lw=0, zorder=0, label="lost in fp16 (rounds to 0)")
    span(LOST_TOP, NORMAL_BOTTOM, color=COLORS["subnormal"], lw=0, zorder=0,
         label="fp16 subnormal")
    span(NORMAL_BOTTOM, high, color=COLORS["normal"], lw=0, zorder=0, label="fp16 normal")
    line = ax.axvline if vertical else ax.axhline
    for edge in (SUBNORMAL_BOTTOM, NORMAL_BOTTOM):
        line(edge, color="0.35", lw=0.8, ls=":", zorder=1)


def power_ticks(values) -> list[str]:
    return [f"$2^{{{v}}}$" for v in values]


def plot_underflow(hist: dict, fractions: dict, layers: list[str], quantiles: list[list[float]],
                   stem: Path) -> list[Path]:
    exponents, counts = hist["exponents"], hist["counts"]
    nonzero = sum(counts)
    percent = [100.0 * c / nonzero for c in counts]
    low = min(exponents[0], BAND[0]) - 1
    high = max(exponents[-1] + 1, NORMAL_BOTTOM) + 1
    with figure_style():
        fig, (ax, bx) = new_figure(10.5, 3.9, ncols=2, gridspec_kw={"width_ratios": [1.7, 1]})
        shade_fp16_ranges(ax, low, high, vertical=True)
        ax.bar(exponents, percent, width=1.0, align="edge", color=COLORS["bars"],
               edgecolor="white", lw=0.4, zorder=2, label="activation gradients (fp32)")
        top = max(percent) * 1.6
        ax.add_patch(_band_patch(ax, top))
        ax.set_xlim(low, high)
        ax.set_ylim(0, top)
        ticks = list(range(4 * math.ceil(low / 4), high + 1, 4))
        ax.set_xticks(ticks, power_ticks(ticks))
        ax.set_xlabel("|activation gradient| (the bar at $2^e$ counts values in "
                      "[$2^e$, $2^{e+1}$))")
        ax.set_ylabel("% of nonzero values")
        ax.set_title("Activation gradients recorded in fp32, against fp16's range")
        ax.text(0.01, 0.97,
                f"% of the nonzero values throughout (the\n"
                f"{100 * fractions['zero_in_fp32']:.1f}% of all values that are zero in fp32 "
                f"are left out):\nfp16 rounds {100 * fractions['lost_of_nonzero']:.1f}% to 0 "
                f"and {100 * fractions['subnormal_of_nonzero']:.1f}% to subnormals;"
                f"\nof the values fp16 loses, loss scale\n8 / 128 / 32768 recovers "
                + " / ".join(f"{100 * fractions['by_scale'][s]['recovered_of_lost']:.1f}%"
                             for s in ("8", "128", "32768")),
                transform=ax.transAxes, va="top", fontsize=7.5, zorder=4,
                bbox={"facecolor": "white", "alpha": 0.85, "lw": 0})
        ax.legend(fontsize=7, loc="upper right", frameon=True, facecolor="white", framealpha=0.9,
                  edgecolor="none")

        positions = list(range(len(layers)))
        shade_fp16_ranges(bx, low, high, vertical=False)
        for x, (q10, q50, q90) in zip(positions, quantiles):
            bx.plot([x, x], [math.log2(q10), math.log2(q90)], color=COLORS["bars"], lw=2.5,
                    solid_capstyle="butt", zorder=3)
            bx.plot([x], [math.log2(q50)], "o", color="white", mec=COLORS["bars"], ms=5,
                    zorder=4)
        bx.set_xticks(positions, layers)
        bx.set_ylim(low, high)
        yticks = list(range(4 * math.ceil(low / 4), high + 1, 4))
        bx.set_yticks(yticks, power_ticks(yticks))
        bx.set_xlabel("layer output (input side first)")
        bx.set_ylabel("|gradient|: 10th-90th percentile, median")
        bx.set_title("Per layer: smaller toward the input")
        bx.grid(axis="x", alpha=0)
        fig.tight_layout()
        return save_figure(fig, stem)


def _band_patch(ax, top):
    from matplotlib.patches import Rectangle

    return Rectangle((BAND[0], 0), BAND[1] - BAND[0], top, fill=False, hatch="///",
                     edgecolor=COLORS["band"], lw=1.0, zorder=3,
                     label="[$2^{-27}$, $2^{-24}$): recovered by scale 8")
