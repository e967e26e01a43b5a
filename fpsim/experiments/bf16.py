"""Experiment 5: bfloat16. Its 8 exponent bits give it fp32's range, so ``"bf16-mixed"`` trains
with no loss scaling at all; its 8 significand bits (fp16 has 11) make an update vanish at
``|w| / |u|`` above 2**8 = 256 instead of 2048, so without a master copy it stalls sooner and
farther from the solution than fp16.

Part 1: the teacher-task MLP (``fpsim.train.train``) in ``"32-true"``, ``"bf16-mixed"`` and
``"16-mixed"``, all without a loss scaler. Part 2: experiment 3's least-squares problem at the
same small learning rate in ``"16-true"`` and ``"bf16-true"`` without a master copy, and
``"bf16-true"`` with one.
"""
from __future__ import annotations

import math

import numpy as np

from ..optim import SGD, Optimizer
from ..plots.bf16 import plot_bf16
from ..train import loss_hash, train
from . import Context, Result, register
from ._tasks import (PRECISION_BITS, build_mlp, classification_split, first_stalled_step,
                     json_float, regression_problem, run_regression)

TITLE = "BF16: no loss scaling needed, but more lost updates without master weights"
LR_CLASSIFIER, LR_REGRESSION, BATCH = 0.1, 0.01, 64
MIXED = {"fp32 (32-true)": "32-true", "bf16-mixed, no loss scaling": "bf16-mixed",
         "16-mixed, no loss scaling": "16-mixed"}
REGRESSION = {  # label -> (policy, master, format of the weights)
    "fp16 weights, no master copy": ("16-true", None, "fp16"),
    "bf16 weights, no master copy": ("bf16-true", None, "bf16"),
    "bf16 weights + fp32 master copy": ("bf16-true", "fp32", "bf16"),
}


def _mean(values) -> float:
    """Mean by an exact sum (math.fsum): the same bits on every machine."""
    values = [float(v) for v in values]
    return math.fsum(values) / len(values)


@register("bf16", TITLE)
def run(ctx: Context) -> Result:
    steps_classifier, steps_regression = (300, 600) if ctx.quick else (1500, 1000)
    data, _ = classification_split()
    classifier, mixed_losses = {}, {}
    for label, policy in MIXED.items():
        ctx.progress(f"  {label}")
        model = build_mlp(policy)
        result = train(model, data, optimizer=Optimizer(model, SGD(lr=LR_CLASSIFIER)),
                       scaler=None, policy=policy, steps=steps_classifier, batch_size=BATCH,
                       seed=0, progress=False)
        mixed_losses[label] = result.losses
        underflow = [r.underflow_fraction for r in result.records]
        classifier[label] = {
            "policy": policy, "loss_sha256": result.loss_hash,
            "mean_loss_last_50": _mean(result.losses[-50:]),
            "nonfinite_loss_steps": len(result.nonfinite_steps),
            "mean_gradient_underflow_fraction": _mean(underflow),
            "max_gradient_underflow_fraction": max(underflow),
        }
    reference = list(MIXED)[0]
    for label in list(MIXED)[1:]:
        gap = np.abs(mixed_losses[label].astype(np.float64)
                     - mixed_losses[reference].astype(np.float64))  # exact differences
        classifier[label]["max_abs_loss_gap_to_fp32"] = float(gap.max())
        classifier[label]["mean_abs_loss_gap_to_fp32"] = _mean(gap)

    problem = regression_problem()
    regression, regression_losses, windows = {}, {}, {}
    for label, (policy, master, fmt) in REGRESSION.items():
        ctx.progress(f"  {label}")
        r = run_regression(problem, policy, master, LR_REGRESSION, steps_regression)
        regression_losses[label] = r.losses
        bits = PRECISION_BITS[fmt]
        ratio, lost = r.log.arrays()
        regression[label] = {
            "policy": policy, "master": master, "loss_sha256": loss_hash(r.losses),
            "final_loss": json_float(r.losses[-1]), "final_weight_error": r.weight_error[-1],
            "updates": int(ratio.size), "lost_updates": int(lost.sum()),
            "lost_fraction": int(lost.sum()) / max(int(ratio.size), 1),
            "lost_fraction_last_100_steps": _mean(r.lost_fraction[-100:]),
            "first_stalled_step": first_stalled_step(r.lost_fraction),
            f"window_2^{bits}": r.log.window(bits),
        }
        if master is None:
            windows[label] = (r.log.binned(), bits)
            regression[label]["ratio_bins"] = r.log.binned()
    fp16, bf16 = (regression[label] for label in list(REGRESSION)[:2])
    ratios = {"weight_error_bf16_over_fp16":
              bf16["final_weight_error"] / fp16["final_weight_error"],
              "loss_bf16_over_fp16": bf16["final_loss"] / fp16["final_loss"]}
    numbers = {"task": {"classifier": f"MLP 16-64-4 (ReLU), teacher data, SGD lr "
                                      f"{LR_CLASSIFIER}, batch {BATCH}, {steps_classifier} "
                                      f"steps, no loss scaler",
                        "regression": f"32 weights, full-batch SGD lr {LR_REGRESSION}, "
                                      f"{steps_regression} steps"},
               "classifier": classifier, "regression": regression,
               "regression_ratios": ratios}
    figures = plot_bf16(mixed_losses, reference, regression_losses, windows, ctx.out / "bf16")
    return Result("bf16", TITLE, numbers, [f.name for f in figures],
                  _summary(classifier, regression, ratios))


def _summary(c: dict, r: dict, ratios: dict) -> str:
    fp32, bf16, fp16 = (c[label] for label in MIXED)
    r16, rbf, rbf_master = (r[label] for label in REGRESSION)
    return (
        f"bf16 keeps fp32's 8 exponent bits, so gradients that fp16 would flush to zero stay "
        f"representable and `bf16-mixed` needs no loss scaling: the MLP trained without a "
        f"scaler flushed {100 * bf16['mean_gradient_underflow_fraction']:.2g}% of its gradient "
        f"values to zero (fp16 without scaling: "
        f"{100 * fp16['mean_gradient_underflow_fraction']:.2g}% on average, up to "
        f"{100 * fp16['max_gradient_underflow_fraction']:.2g}% in a step) and its loss stayed "
        f"within {bf16['max_abs_loss_gap_to_fp32']:.2g} of the fp32 run at every step (mean "
        f"gap {bf16['mean_abs_loss_gap_to_fp32']:.2g}; final {bf16['mean_loss_last_50']:.4f} vs "
        f"{fp32['mean_loss_last_50']:.4f}). On this small network fp16 without scaling keeps up "
        f"too (its gradients sit well inside fp16's range), and its extra "
        f"precision puts it even closer to fp32. The price is precision: 8 significand bits "
        f"against fp16's 11, so an update is lost once |w|/|u| exceeds 2^8 = 256 rather than "
        f"2^11 = 2048. On experiment 3's regression at the same learning rate, bf16 weights "
        f"without a master copy froze with the weights "
        f"{100 * rbf['final_weight_error']:.1f}% from the solution against fp16's "
        f"{100 * r16['final_weight_error']:.1f}% (x{ratios['weight_error_bf16_over_fp16']:.1f}; "
        f"the 2^3 precision gap predicts about 8) and a loss "
        f"x{ratios['loss_bf16_over_fp16']:.0f} higher (about 8^2 = 64 predicted), and it froze "
        f"sooner: every update was lost from step {rbf['first_stalled_step']} on (fp16: step "
        f"{r16['first_stalled_step']}). With an fp32 master copy the bf16 run loses "
        f"{100 * rbf_master['lost_fraction']:.2g}% and ends "
        f"{100 * rbf_master['final_weight_error']:.2f}% from the solution, which is what "
        f"rounding the weights to bf16 costs.")
