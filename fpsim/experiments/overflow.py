"""Experiment 4: overflow and dynamic loss scaling.

An MLP trains on the teacher task in ``"16-mixed"`` (fp32 master weights, fp16 matmuls and
their gradients). A static scale of 2**24 makes the scaled fp16 gradients overflow on every
step: with skip-on-overflow (Megatron's ``ConstantGradScaler``) every step is skipped and the
model never moves; without it (DeepSpeed's static ``LossScaler`` never reports an overflow)
the inf/NaN gradients reach the weights and the loss is NaN from the next step on. Dynamic
scalers starting at the same 2**24 back off to a scale that fits, then grow every
``growth_interval`` clean steps until an overflow knocks them back: the sawtooth. torch's
``GradScaler`` and DeepSpeed's ``DynamicLossScaler`` run side by side with the same start and
window; they differ in hysteresis (DeepSpeed absorbs one overflow before backing off, and
refills that allowance only when the scale grows) and in when the first growth comes.
"""
from __future__ import annotations

import math

import numpy as np

from ..optim import SGD, Optimizer
from ..plots.overflow import plot_overflow
from ..scaling import StaticScaler, preset
from ..train import train
from . import Context, Result, register
from ._tasks import build_mlp, classification_split, json_float

TITLE = "Overflow and dynamic loss scaling: static 2^24 vs torch and DeepSpeed"
POLICY = "16-mixed"
INIT_SCALE = 2.0 ** 24
LR = 0.1
BATCH = 64


def scalers(growth_interval: int) -> dict:
    return {
        "static 2^24, skip on overflow": StaticScaler(INIT_SCALE),
        "static 2^24, no skip": StaticScaler(INIT_SCALE, skip_on_overflow=False),
        "torch GradScaler": preset("torch", init_scale=INIT_SCALE,
                                   growth_interval=growth_interval),
        "DeepSpeed DynamicLossScaler": preset("deepspeed", init_scale=INIT_SCALE,
                                              growth_interval=growth_interval),
    }


def exact_log2(scale: float) -> int:
    """log2 of a power of two, exactly (frexp, no libm)."""
    mantissa, exponent = math.frexp(scale)
    if mantissa != 0.5:
        raise ValueError(f"scale {scale!r} is not a power of two")
    return exponent - 1


def scale_changes(scales) -> list[list[int]]:
    """``[step, log2 scale]`` at step 0 and wherever the scale differs from the step before."""
    out = []
    for step, scale in enumerate(scales):
        if step == 0 or scale != scales[step - 1]:
            out.append([step, exact_log2(scale)])
    return out


@register("overflow", TITLE)
def run(ctx: Context) -> Result:
    steps, interval = (300, 50) if ctx.quick else (1500, 100)
    data, _ = classification_split()
    initial = build_mlp(POLICY).state_dict()
    runs, numbers_runs = {}, {}
    for label, scaler in scalers(interval).items():
        ctx.progress(f"  {label}")
        model = build_mlp(POLICY)
        # NaN weights are the point of one run: the engine's float32 ops would warn.
        with np.errstate(invalid="ignore", over="ignore"):
            result = train(model, data, optimizer=Optimizer(model, SGD(lr=LR)), scaler=scaler,
                           policy=POLICY, steps=steps, batch_size=BATCH, seed=0, progress=False)
        records = result.records
        scales = [r.scale for r in records]
        skipped = [r.skipped for r in records]
        final = result.scaler_state
        params = model.state_dict()
        finite_params = np.concatenate([np.isfinite(v).reshape(-1) for v in params.values()])
        moved = any(not np.array_equal(params[k], initial[k], equal_nan=True) for k in params)
        losses = result.losses
        tail = losses[-50:]
        runs[label] = {"losses": losses, "scales": scales, "skipped": skipped,
                       "dynamic": not isinstance(scaler, StaticScaler)}
        numbers_runs[label] = {
            "loss_sha256": result.loss_hash,
            "mean_loss_last_50": json_float(math.fsum(tail.tolist()) / len(tail)),
            "first_nonfinite_loss_step": (result.nonfinite_steps[0]
                                          if result.nonfinite_steps else None),
            "nonfinite_parameter_fraction": float(1.0 - finite_params.mean()),
            "weights_changed": bool(moved),
            "skipped_steps": int(sum(skipped)),
            "overflows": final.total_overflows,
            "backoffs": final.backoffs, "growths": final.growths,
            "overflows_absorbed_by_hysteresis": final.total_overflows - final.backoffs
            if not isinstance(scaler, StaticScaler) else 0,
            "scale_changes": scale_changes(scales),
            "skipped_at": [i for i, s in enumerate(skipped) if s] if sum(skipped) < steps
            else "every step",
        }
    figures = plot_overflow(runs, ctx.out / "overflow")
    numbers = {"task": {"policy": POLICY, "steps": steps, "growth_interval": interval,
                        "init_scale_log2": exact_log2(INIT_SCALE), "lr": LR, "batch": BATCH,
                        "model": "MLP 16-64-4 (ReLU), SGD", "data": "teacher"},
               "runs": numbers_runs}
    return Result("overflow", TITLE, numbers, [f.name for f in figures],
                  _summary(numbers_runs, steps, interval))


def settled_range(run: dict) -> tuple[int, int]:
    """Lowest and highest log2 scale from the first step that was not skipped on."""
    skipped = set(run["skipped_at"])
    settled = next(step for step in range(len(skipped) + 1) if step not in skipped)
    held = [log2 for step, log2 in run["scale_changes"] if step >= settled]
    before = [log2 for step, log2 in run["scale_changes"] if step <= settled][-1]
    return min(held + [before]), max(held + [before])


def _summary(n: dict, steps: int, interval: int) -> str:
    skip, noskip = n["static 2^24, skip on overflow"], n["static 2^24, no skip"]
    torch, ds = n["torch GradScaler"], n["DeepSpeed DynamicLossScaler"]
    torch_lo, torch_hi = settled_range(torch)
    ds_lo, ds_hi = settled_range(ds)
    return (
        f"An MLP in `16-mixed` (fp16 matmuls and activation gradients, fp32 master weights), "
        f"{steps} steps, every run starting from a loss scale of 2^24. With that scale held "
        f"fixed, the scaled fp16 gradients exceed 65504 on every step: skipping overflowing "
        f"steps (Megatron's constant scaler) skips all {skip['skipped_steps']} of them and the "
        f"weights never change; not skipping (DeepSpeed's static scaler never reports an "
        f"overflow) applies inf/NaN gradients once and the loss is NaN from step "
        f"{noskip['first_nonfinite_loss_step']} on, with "
        f"{100 * noskip['nonfinite_parameter_fraction']:.0f}% of the weights NaN. The dynamic "
        f"scalers (growth every {interval} clean steps) back off to a scale that fits within a "
        f"few skipped steps and then saw-tooth: each growth is followed, sooner or later, by an "
        f"overflow and a backoff (after the descent from 2^24 torch moved between "
        f"2^{torch_lo} and 2^{torch_hi}, DeepSpeed between 2^{ds_lo} and 2^{ds_hi}). torch skipped "
        f"{torch['skipped_steps']} steps ({torch['backoffs']} backoffs, {torch['growths']} "
        f"growths), DeepSpeed {ds['skipped_steps']} ({ds['backoffs']} backoffs, "
        f"{ds['growths']} growths, {ds['overflows_absorbed_by_hysteresis']} overflows absorbed "
        f"by hysteresis): DeepSpeed's hysteresis of 2 skips an overflowing step without "
        f"lowering the scale the first time, and the allowance comes back only with the next "
        f"growth, so it holds a larger scale longer at the price of more skipped steps; its "
        f"first growth also needs {interval} + 1 clean steps. Both reach a loss of "
        f"{torch['mean_loss_last_50']:.3f} / {ds['mean_loss_last_50']:.3f} (mean of the last 50 "
        f"steps).")
