"""Experiment 3: master weights. fp16 weights updated in place lose every update smaller than
half an ulp of the weight; an fp32 master copy keeps them (the paper's first technique).

Task: least squares on one ``Linear`` layer (``_tasks.regression_problem``), full-batch SGD at
a small learning rate, under ``"16-true"`` (fp16 weights, activations and gradients) with and
without an fp32 master copy, plus ``"32-true"`` for reference. Every element update is
recorded (``_tasks.UpdateLog``): its ratio ``|w| / |u|`` and whether it was lost.

The 2048x argument: an fp16 weight ``w`` in ``[2**e, 2**(e+1))`` has ulp ``2**(e-10)``; the
update ``u`` is lost when ``|u|`` is below half of that, i.e. when ``|w| / |u|`` exceeds
``2**11 * w / 2**e``, a threshold between 2048 and 4096. So no update with ratio below 2048 is
ever lost and every one above 4096 is (normal weights, round to nearest even).
"""
from __future__ import annotations

from ..plots.master_weights import plot_master_weights
from ..train import loss_hash
from . import Context, Result, register
from ._tasks import (PRECISION_BITS, first_stalled_step, json_float, regression_problem,
                     run_regression)

TITLE = "Master weights: fp16 weights updated directly vs an fp32 master copy"
LR = 0.01
RUNS = {  # label -> (policy, master)
    "fp16 weights, no master copy": ("16-true", None),
    "fp16 weights + fp32 master copy": ("16-true", "fp32"),
    "fp32 (32-true)": ("32-true", "fp32"),
}


@register("master_weights", TITLE)
def run(ctx: Context) -> Result:
    steps = 600 if ctx.quick else 1000
    problem = regression_problem()
    results = {}
    for label, (policy, master) in RUNS.items():
        ctx.progress(f"  {label}")
        results[label] = run_regression(problem, policy, master, LR, steps)
    bits = PRECISION_BITS["fp16"]
    fp16_only = results[list(RUNS)[0]]
    window = fp16_only.log.window(bits)
    bins = fp16_only.log.binned()
    runs_numbers = {}
    for label, r in results.items():
        ratio, lost = r.log.arrays()
        runs_numbers[label] = {
            "policy": RUNS[label][0], "master": RUNS[label][1],
            "loss_sha256": loss_hash(r.losses), "final_loss": json_float(r.losses[-1]),
            "final_weight_error": r.weight_error[-1],
            "updates": int(ratio.size), "lost_updates": int(lost.sum()),
            "lost_fraction_last_100_steps": float(r.lost_fraction[-100:].mean()),
            "first_stalled_step": first_stalled_step(r.lost_fraction),
        }
    predicted_low = window["above"]["updates"]
    predicted_high = window["within"]["updates"] + window["above"]["updates"]
    numbers = {
        "task": {"samples": int(problem.x.shape[0]), "features": int(problem.x.shape[1]),
                 "lr": LR, "steps": steps, "optimizer": "SGD, full batch, no loss scaling"},
        "runs": runs_numbers,
        "fp16_window": window,
        "fp16_lost_bounds": {"ratio_above_4096": predicted_low,
                             "ratio_at_least_2048": predicted_high,
                             "measured_lost": window["below"]["lost"] + window["within"]["lost"]
                             + window["above"]["lost"]},
        "ratio_bins_no_master": bins,
    }
    figures = plot_master_weights(
        {label: (r.losses, r.lost_fraction) for label, r in results.items()}, bins, bits,
        ctx.out / "master_weights")
    a, b = runs_numbers[list(RUNS)[0]], runs_numbers[list(RUNS)[1]]
    ref = runs_numbers[list(RUNS)[2]]
    exact = (", exactly: the targets are fp16(x . w*), and once the fp16 weights equal w* the "
             "fp16 forward pass rounds its predictions to the same values"
             if b["final_loss"] == 0 else "")
    summary = (
        f"Least squares on one linear layer ({problem.x.shape[1]} fp16 weights of magnitude "
        f"1-2, full-batch SGD, lr = {LR}, {steps} steps) in fp16 (`16-true`), once updating the "
        f"fp16 weights directly and once through an fp32 master copy. Without the master copy "
        f"the run freezes at step {a['first_stalled_step']}: from there every update is lost, "
        f"the loss stays at {a['final_loss']:.3g} and the weights "
        f"{100 * a['final_weight_error']:.2f}% "
        f"from the solution; with the master copy the same fp16 model reaches loss "
        f"{b['final_loss']:.3g} and weight error {b['final_weight_error']:.2g}{exact}; fp32 "
        f"reaches {ref['final_loss']:.2g}. Why: near the solution the update lr * grad shrinks "
        f"with the error, and an fp16 weight absorbs any update below half its ulp, i.e. when "
        f"|w|/|u| exceeds 2^11 = 2048 (for w = 1) up to 4096 (for w just below 2). The "
        f"recorded updates obey this exactly: of {window['below']['updates']} updates with "
        f"ratio below 2048 none was lost, of {window['above']['updates']} above 4096 all "
        f"were, and {window['within']['lost']} of {window['within']['updates']} in between. "
        f"The master copy accumulates those small steps in fp32 (24 bits, a threshold of "
        f"2^24) until they move the fp16 weight.")
    return Result("master_weights", TITLE, numbers, [f.name for f in figures], summary)
