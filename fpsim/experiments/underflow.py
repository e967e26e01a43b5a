"""Experiment 1: which activation gradients fp16 cannot hold (the paper's Fig. 3).

The small-initialised deep MLP of ``_models`` is trained for a few steps in fp32 ("32-true",
Adam), then four batches go forward and backward in fp32 with every layer's output (the
pre-activations and the logits) retaining its gradient. Each recorded value g is then judged
against fp16 exactly:

- ``round_to(g, fp16) == 0``: lost. That is |g| <= 2**-25: half the smallest subnormal 2**-24,
  where round-to-nearest-even sends the tie 2**-25 itself to zero.
- 2**-25 < |g| < 2**-14: subnormal, kept with fewer than 11 significant bits.
- |g| >= 2**-14: normal.

and against loss scales s = 8, 128, 32768: a value lost unscaled is *recovered* at s when
``round_to(g * s, fp16) != 0`` (g * s is exact in fp32: s is a power of two), and *overflows*
when ``round_to(g * s, fp16)`` is infinite. Gradients' magnitudes are binned by their binary
exponent (``numpy.frexp``, exact), so the histogram has the same counts on every machine.
"""
from __future__ import annotations

import numpy as np

from ..autograd import Tensor, cross_entropy, use_policy
from ..formats import FP16
from ..nn import Linear
from ..plots.underflow import plot_underflow
from ..rounding import round_to
from ..train import train
from . import Context, Result, register
from ._models import BATCH, DEPTH, FEATURES, WIDTH, adam, blobs, small_init_mlp

TITLE = "Gradient underflow: activation gradients against fp16's range"
SCALES = (8, 128, 32768)
WARMUP_STEPS = 20    # fp32 training steps before recording ("a few steps in")
BATCHES = 4          # batches whose gradients are recorded (4 x 64 samples)
LOST_MAX = 2.0 ** -25            # |g| <= this rounds to zero in fp16
SUBNORMAL_MIN = 2.0 ** -24       # fp16's smallest subnormal
NORMAL_MIN = 2.0 ** -14          # fp16's smallest normal
BAND = (2.0 ** -27, 2.0 ** -24)  # the paper's band: lost in fp16, recovered by a scale of 8
QUANTILES = (0.1, 0.5, 0.9)

__all__ = ["SCALES", "BAND", "LOST_MAX", "SUBNORMAL_MIN", "NORMAL_MIN", "WARMUP_STEPS", "BATCHES",
           "MODEL", "activation_gradients", "record_activation_gradients", "judge",
           "exponent_histogram", "layer_quantiles", "run"]
MODEL = (f"ReLU MLP {FEATURES}-{WIDTH}x{DEPTH}-8, weights 0.4x PyTorch's default, "
         f"after {WARMUP_STEPS} fp32 Adam steps")


def activation_gradients() -> list[np.ndarray]:
    """The experiment's data: the small-initialised ten-layer MLP (``MODEL``) trained
    ``WARMUP_STEPS`` fp32 steps, then every layer's output gradient over ``BATCHES`` batches,
    per layer from input to logits (float32). Seeded: the same bits on every call."""
    data, model = blobs(), small_init_mlp(seed=0)
    train(model, data, optimizer=adam(model), policy="32-true", steps=WARMUP_STEPS,
          batch_size=BATCH, seed=0, progress=False)
    return record_activation_gradients(model, data)


def record_activation_gradients(model, data, *, batches: int = BATCHES, seed: int = 1):
    """Gradients of every Linear output (fp32 backward of the mean cross-entropy), per layer
    from input to output, each concatenated over ``batches`` random batches."""
    rng = np.random.default_rng(seed)
    per_layer: list[list[np.ndarray]] = []
    with use_policy("32-true"):
        for _ in range(batches):
            idx = rng.integers(0, len(data), BATCH)
            h, watched = Tensor(data.x[idx]), []
            for layer in model:
                h = layer(h)
                if isinstance(layer, Linear):
                    watched.append(h.retain_grad())
            cross_entropy(h, data.y[idx]).backward()
            model.zero_grad()
            if not per_layer:
                per_layer = [[] for _ in watched]
            for store, t in zip(per_layer, watched):
                store.append(t.grad.numpy().astype(np.float32).reshape(-1))
    return [np.concatenate(parts) for parts in per_layer]


def judge(g: np.ndarray, scales=SCALES) -> dict:
    """Counts and fractions of fp32 gradient values that fp16 keeps, loses, and that each loss
    scale recovers or overflows. Fractions are exact ratios of counts."""
    g = np.asarray(g, np.float32)
    total = int(g.size)
    nonzero = g != 0
    n_nonzero = int(np.count_nonzero(nonzero))
    a = np.abs(g)
    with np.errstate(over="ignore"):
        in_fp16 = round_to(g, FP16)
        lost = nonzero & (in_fp16 == 0)
        n_lost = int(np.count_nonzero(lost))
        counts = {
            "values": total,
            "zero_in_fp32": total - n_nonzero,
            "normal": int(np.count_nonzero(a >= NORMAL_MIN)),
            "subnormal": int(np.count_nonzero((a > LOST_MAX) & (a < NORMAL_MIN))),
            "lost_in_fp16": n_lost,
            "in_band_2^-27_2^-24": int(np.count_nonzero((a >= BAND[0]) & (a < BAND[1]))),
        }
        by_scale = {}
        for s in (1,) + tuple(scales):
            scaled = round_to(g * np.float32(s), FP16)
            by_scale[str(s)] = {
                "recovered": int(np.count_nonzero(lost & (scaled != 0))),
                "still_lost": int(np.count_nonzero(nonzero & (scaled == 0))),
                "overflow": int(np.count_nonzero(np.isinf(scaled))),
            }
    assert counts["normal"] + counts["subnormal"] + n_lost == n_nonzero  # the three ranges
    fractions = {
        "zero_in_fp32": _ratio(counts["zero_in_fp32"], total),
        "zero_in_fp16": _ratio(counts["zero_in_fp32"] + n_lost, total),
        "lost_of_nonzero": _ratio(n_lost, n_nonzero),
        "normal_of_nonzero": _ratio(counts["normal"], n_nonzero),
        "subnormal_of_nonzero": _ratio(counts["subnormal"], n_nonzero),
        "band_of_nonzero": _ratio(counts["in_band_2^-27_2^-24"], n_nonzero),
        "by_scale": {s: {"recovered_of_lost": _ratio(c["recovered"], n_lost),
                         "still_lost_of_nonzero": _ratio(c["still_lost"], n_nonzero),
                         "overflow_of_nonzero": _ratio(c["overflow"], n_nonzero)}
                     for s, c in by_scale.items()},
    }
    return {"counts": {**counts, "by_scale": by_scale}, "fractions": fractions}


def exponent_histogram(g: np.ndarray) -> dict:
    """Counts of nonzero |g| by binary exponent e (2**e <= |g| < 2**(e+1)), from the smallest
    exponent present to the largest."""
    a = np.abs(np.asarray(g, np.float32))
    a = a[a != 0]
    exponents = np.frexp(a)[1].astype(np.int64) - 1
    low, high = int(exponents.min()), int(exponents.max())
    counts = np.bincount(exponents - low, minlength=high - low + 1)
    return {"exponents": list(range(low, high + 1)), "counts": [int(c) for c in counts]}


def layer_quantiles(per_layer) -> list[list[float]]:
    """Per layer, the 10th, 50th and 90th percentile of the nonzero |g| (values that occur in
    the data: no interpolation, so exact)."""
    out = []
    for g in per_layer:
        a = np.sort(np.abs(g[g != 0]))
        out.append([float(a[min(len(a) - 1, int(q * len(a)))]) for q in QUANTILES])
    return out


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


@register("underflow", TITLE)
def run(ctx: Context) -> Result:
    ctx.progress(f"underflow: {WARMUP_STEPS} fp32 training steps, then {BATCHES} recorded "
                 f"backward passes")
    per_layer = activation_gradients()
    everything = np.concatenate(per_layer)
    verdict = judge(everything)
    hist = exponent_histogram(everything)
    quantiles = layer_quantiles(per_layer)
    layers = [f"{i + 1}" for i in range(DEPTH)] + ["logits"]
    figures = plot_underflow(hist, verdict["fractions"], layers, quantiles,
                             ctx.out / "underflow_histogram")
    f = verdict["fractions"]
    scale = f["by_scale"]
    numbers = {
        "model": MODEL,
        "recorded_values": verdict["counts"]["values"], "counts": verdict["counts"],
        "fractions": f, "histogram": hist, "layers": layers,
        "layer_abs_quantiles_10_50_90": quantiles,
    }
    pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
    median_in, median_out = quantiles[0][1], quantiles[-2][1]
    per_layer_octaves = (np.log2(median_out) - np.log2(median_in)) / (DEPTH - 1)
    summary = (
        f"Activation gradients (the gradient of every layer's output, {len(everything):,} "
        f"values over {BATCHES} batches of {BATCH}) of a ten-layer ReLU MLP with small "
        f"initial weights, recorded in fp32 after {WARMUP_STEPS} training steps. "
        f"{pct(f['zero_in_fp32'])} are exactly zero in fp32 (ReLUs that were off; the paper's "
        f"SSD had 67%) and are left out from here on: every other percentage is of the "
        f"nonzero values. Cast to fp16, {pct(f['lost_of_nonzero'])} of them are at or below "
        f"2^-25 and round to zero, and another {pct(f['subnormal_of_nonzero'])} survive only "
        f"as subnormals. "
        f"The cause is depth: each small layer shrinks the gradient on its way down (by "
        f"2^-{per_layer_octaves:.1f} on average; 0.4/sqrt(6) = 2^-2.6 expected at "
        f"initialisation), so the median magnitude falls from 2^{np.log2(median_out):.1f} at "
        f"the last hidden layer to 2^{np.log2(median_in):.1f} at the first (right panel), "
        f"while the forward activations stay near 2^-4 thanks to the biases. A loss scale "
        f"of 8 recovers {pct(scale['8']['recovered_of_lost'])} of the lost values (the "
        f"[2^-27, 2^-24) band holds {pct(f['band_of_nonzero'])} of the nonzero ones; for SSD "
        f"the paper found 8 enough), 128 recovers {pct(scale['128']['recovered_of_lost'])} "
        f"and 32768 {pct(scale['32768']['recovered_of_lost'])} (NVIDIA quotes all but about "
        f"0.1% for 32K), leaving {pct(scale['32768']['still_lost_of_nonzero'])} of the nonzero "
        f"values lost, with {pct(scale['32768']['overflow_of_nonzero'])} overflowing: the "
        f"largest is below 2^{hist['exponents'][-1] + 1}, so even 32768 leaves it far below "
        f"fp16's maximum 65504 (the overflows a dynamic scaler meets come from larger values, "
        f"such as the batch-summed weight gradients of experiment 2).")
    rows = ["| loss scale | lost of nonzero | recovered of lost | overflow of nonzero |",
            "|---|---|---|---|"]
    for s in (1,) + SCALES:
        c = scale[str(s)]
        rows.append(f"| {s} | {pct(c['still_lost_of_nonzero'])} | "
                    f"{pct(c['recovered_of_lost'])} | {pct(c['overflow_of_nonzero'])} |")
    return Result("underflow", TITLE, numbers, [p.name for p in figures], summary,
                  "\n".join(rows))
